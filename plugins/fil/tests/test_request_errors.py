"""Bad requests get clear 400 / INVALID_ARGUMENT errors, and the model keeps serving."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import xgboost
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer

STATUS = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}


@pytest.fixture(scope="module")
def server(kit: Any, trained: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("fil_errors_repo")
    save = kit.save_xgboost(trained.xgb_regressor, "json")
    kit.write_model(repo, "fixed", kit.config("xgboost_json", [1], max_batch_size=8), {"xgboost.json": save})
    kit.write_model(repo, "variable", kit.config("xgboost_json", [1], input_dims=[-1]), {"xgboost.json": save})
    running = kit.start_server(repo)
    yield running
    running.stop()


def _error(kit: Any, server: RunningServer, protocol: str, model: str, rows: np.ndarray,
           datatype: str = "FP32") -> InferenceServerException:
    with pytest.raises(InferenceServerException) as raised:
        kit.infer(server, protocol, model, rows, datatype)
    return raised.value


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_wrong_feature_count_with_fixed_dims(kit: Any, server: RunningServer, protocol: str) -> None:
    error = _error(kit, server, protocol, "fixed", kit.rows(2)[:, :4])
    assert error.status() == STATUS[protocol]
    assert "unexpected shape for input 'input__0' for model 'fixed'. Expected [-1, 5], got [2, 4]" in error.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_wrong_feature_count_with_variable_dims(kit: Any, server: RunningServer, protocol: str) -> None:
    error = _error(kit, server, protocol, "variable", np.zeros((3, 7), np.float32))
    assert error.status() == STATUS[protocol]
    assert ("model 'variable' reads 5 features per row, but input 'input__0' has shape [3, 7]; "
            "expected [-1, 5]") in error.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_wrong_datatype(kit: Any, server: RunningServer, protocol: str) -> None:
    error = _error(kit, server, protocol, "fixed", kit.rows(2).astype(np.float64), "FP64")
    assert error.status() == STATUS[protocol]
    assert "input__0" in error.message() and "fixed" in error.message()
    assert "FP64" in error.message() and "FP32" in error.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batch_larger_than_max_batch_size(kit: Any, server: RunningServer, protocol: str) -> None:
    error = _error(kit, server, protocol, "fixed", kit.rows(9))
    assert error.status() == STATUS[protocol]
    assert "fixed" in error.message() and "8" in error.message()


def test_the_model_still_serves_after_bad_requests(kit: Any, trained: Any, server: RunningServer) -> None:
    for protocol in ("http", "grpc"):
        _error(kit, server, protocol, "variable", np.zeros((1, 2), np.float32))
    rows = kit.rows(8)
    expected = trained.xgb_regressor.predict(xgboost.DMatrix(rows))
    for model in ("fixed", "variable"):
        np.testing.assert_allclose(kit.infer(server, "grpc", model, rows), expected, rtol=1e-5, atol=1e-5)
