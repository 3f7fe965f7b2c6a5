"""KIND_GPU instances: XGBoost models run on the GPU with XGBoost; other model types are refused clearly."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import xgboost

from triton_serve.plugin import visible_gpu_ids
from triton_serve.testing import RunningServer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not visible_gpu_ids(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(xgboost.build_info().get("USE_CUDA") is not True, reason="needs an XGBoost built with CUDA"),
]
ON_GPU = "instance_group [{ kind: KIND_GPU gpus: [0] }]\n"


def test_xgboost_on_the_gpu_matches_the_cpu(tmp_path: Path, kit: Any, trained: Any,
                                            server_for: Callable[..., RunningServer]) -> None:
    booster = trained.xgb_multiclass
    config = kit.config("xgboost_ubj", [3], output_class="true", predict_proba="true", extra=ON_GPU)
    kit.write_model(tmp_path, "on_gpu", config, {"xgboost.ubj": kit.save_xgboost(booster, "ubj")})
    server = server_for(tmp_path)
    rows = kit.rows(33)
    for protocol in ("http", "grpc"):
        got = kit.infer(server, protocol, "on_gpu", rows)
        np.testing.assert_allclose(got, booster.predict(xgboost.DMatrix(rows)), rtol=1e-5, atol=1e-5)


def test_other_model_types_are_refused_on_the_gpu(tmp_path: Path, kit: Any, trained: Any,
                                                  server_for: Callable[..., RunningServer]) -> None:
    config = kit.config("lightgbm", [1], output_class="false", extra=ON_GPU)
    kit.write_model(tmp_path, "lgb_on_gpu", config, {"model.txt": kit.save_lightgbm(trained.lgb_regressor)})
    server = server_for(tmp_path)
    client = httpclient.InferenceServerClient(server.http_url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    client.close()
    assert ("KIND_GPU runs only XGBoost models (model_type xgboost, xgboost_json, xgboost_ubj); "
            "model_type 'lightgbm' needs KIND_CPU") in index["lgb_on_gpu"]["reason"]
