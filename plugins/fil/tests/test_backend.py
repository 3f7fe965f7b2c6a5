"""The backend driven directly: several requests in one execute, auto-complete, options and availability."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xgboost
from google.protobuf import text_format

from triton_serve.plugin import (AutoCompleteOptions, InferenceRequest, InstanceSpec, ModelConfig, ModelInstanceGroup,
                                 ModelSpec, ServerError, Tensor, model_parameters)
from triton_serve_fil.backend import FilBackend


def _spec(tmp_path: Path, kit: Any, booster: xgboost.Booster, config_text: str) -> ModelSpec:
    model_dir = kit.write_model(tmp_path, "direct", None, {"xgboost.json": kit.save_xgboost(booster, "json")})
    config = text_format.Merge(config_text, ModelConfig(name="direct", backend="fil"))
    spec = ModelSpec("direct", 1, config, model_dir, model_dir / "1", FilBackend.default_model_filename)
    spec.parameters = model_parameters(FilBackend(), spec)  # as the core does
    return spec


def _request(rows: np.ndarray) -> InferenceRequest:
    tensor = Tensor("input__0", "FP32", tuple(rows.shape), rows)
    return InferenceRequest("direct", 1, inputs={"input__0": tensor})


def _cpu(name: str = "direct_0") -> InstanceSpec:
    return InstanceSpec(name, ModelInstanceGroup(name="direct", kind=ModelInstanceGroup.KIND_CPU), 0, "CPU")


def test_one_execute_answers_requests_of_different_batch_sizes(tmp_path: Path, kit: Any, trained: Any) -> None:
    booster = trained.xgb_multiclass
    spec = _spec(tmp_path, kit, booster, kit.config("xgboost_json", [3], input_dims=[-1], predict_proba="true",
                                                      output_class="true"))
    batches = [kit.rows(1, seed=1), kit.rows(3, seed=2), np.zeros((2, 4), np.float32), kit.rows(2, seed=4)]

    async def run() -> list[Any]:
        model = FilBackend().create_model(spec)
        await model.load()
        instance = model.create_instance(_cpu())
        await instance.load()
        try:
            return list(await instance.execute([_request(rows) for rows in batches]))
        finally:
            await instance.unload()
            await model.unload()

    responses = asyncio.run(run())
    assert len(responses) == 4
    assert responses[2].error is not None and "reads 5 features per row" in responses[2].error.message
    for rows, response in zip(batches, responses):
        if rows.shape[1] == 4:
            continue
        assert response.error is None
        output = response.output("output__0")
        assert output is not None and output.datatype == "FP32" and output.shape == (rows.shape[0], 3)
        np.testing.assert_allclose(output.data, booster.predict(xgboost.DMatrix(rows)), rtol=1e-5, atol=1e-6)


def test_auto_complete_fills_tensors_and_batch_size(tmp_path: Path, kit: Any, trained: Any) -> None:
    spec = _spec(tmp_path, kit, trained.xgb_multiclass,
                 'parameters [{ key: "model_type" value: { string_value: "xgboost_json" } }]')
    FilBackend(AutoCompleteOptions(default_max_batch_size=256)).auto_complete_config(spec)
    assert spec.config.max_batch_size == 256
    assert [(t.name, list(t.dims)) for t in spec.config.input] == [("input__0", [5])]
    # a multiclass model with no output_class/predict_proba: a classifier by its task, one class index per row
    assert [(t.name, list(t.dims)) for t in spec.config.output] == [("output__0", [1])]


def test_auto_complete_keeps_what_the_config_says(tmp_path: Path, kit: Any, trained: Any) -> None:
    spec = _spec(tmp_path, kit, trained.xgb_regressor,
                 kit.config("xgboost_json", [1], input_dims=[-1], max_batch_size=0, output_class="false"))
    FilBackend().auto_complete_config(spec)
    assert spec.config.max_batch_size == 4
    assert list(spec.config.input[0].dims) == [-1]


def test_conflicting_classifier_parameters_fail_the_load(tmp_path: Path, kit: Any, trained: Any) -> None:
    spec = _spec(tmp_path, kit, trained.xgb_binary,
                 kit.config("xgboost_json", [1], output_class="true", is_classifier="false"))
    instance = FilBackend().create_model(spec).create_instance(_cpu())
    with pytest.raises(ServerError, match="failed to load FIL model 'direct' version 1: parameters "
                                          "'output_class' \\(true\\) and 'is_classifier' \\(false\\) disagree"):
        asyncio.run(instance.load())


def test_available_with_treelite_and_says_how_to_install_without(monkeypatch: pytest.MonkeyPatch) -> None:
    assert FilBackend().unavailable_reason() is None
    monkeypatch.setitem(sys.modules, "treelite", None)
    reason = FilBackend().unavailable_reason()
    assert reason is not None and "pip install treelite" in reason
