"""Auto-complete fills max_batch_size, inputs and outputs from the ONNX model, as Triton's onnxruntime backend does."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from triton_serve.plugin import AutoCompleteOptions, DataType, ModelConfig, ModelSpec
from triton_serve_onnx.backend import OnnxRuntimeBackend

ONE = {"onnxruntime": {"default-max-batch-size": "1"}}  # batching models without a dynamic batcher


def _completed(version_dir: Path, config_text: str = "", default_max_batch_size: int = 4) -> ModelConfig:
    config = text_format.Parse(config_text, ModelConfig())
    model = ModelSpec(version_dir.parent.name, 1, config, version_dir.parent, version_dir, "model.onnx")
    OnnxRuntimeBackend(AutoCompleteOptions(default_max_batch_size)).auto_complete_config(model)
    return config


def _tensors(entries: list[dict[str, Any]]) -> list[tuple[str, str, list[int]]]:
    return [(entry["name"], entry["data_type"], [int(d) for d in entry["dims"]]) for entry in entries]


def test_a_model_without_config_file_is_served_with_the_completed_config(kit: Any, tmp_path: Path, tserve: Any,
                                                                        clients: Any, mlp_model: bytes) -> None:
    kit.write_model(tmp_path, "mlp", mlp_model)
    http_client, grpc_client = clients(tserve(tmp_path, backend_config=ONE))
    http_config = http_client.get_model_config("mlp")
    grpc_config = grpc_client.get_model_config("mlp", as_json=True)["config"]
    for config in (http_config, grpc_config):
        assert (config["backend"], config["platform"]) == ("onnxruntime", "onnxruntime_onnx")
        assert int(config["max_batch_size"]) == 1
        assert _tensors(config["input"]) == [("INPUT0", "TYPE_FP32", [4])]
        assert _tensors(config["output"]) == [("OUTPUT0", "TYPE_FP32", [3])]
        assert "dynamic_batching" not in config
    x = np.ones((1, 4), dtype=np.float32)
    np.testing.assert_allclose(kit.infer(http_client, "mlp", INPUT0=x).as_numpy("OUTPUT0"),
                               kit.reference(mlp_model, {"INPUT0": x})["OUTPUT0"], rtol=1e-5, atol=1e-6)


def test_a_batching_model_gets_the_default_max_batch_size(kit: Any, tmp_path: Path) -> None:
    version_dir = kit.write_model(tmp_path, "double", kit.double_model("INT32"))
    config = _completed(version_dir)
    assert config.max_batch_size == 4
    assert [(t.name, DataType.Name(t.data_type), list(t.dims)) for t in config.input] == [("X", "TYPE_INT32", [-1])]
    assert [t.name for t in config.output] == ["Y"] and list(config.output[0].dims) == [-1]
    assert _completed(version_dir, default_max_batch_size=16).max_batch_size == 16


def test_with_the_batcher_installed_a_completed_batching_model_gets_dynamic_batching(
        kit: Any, tmp_path: Path, tserve: Any, clients: Any, mlp_model: bytes) -> None:
    pytest.importorskip("triton_serve_batching")
    kit.write_model(tmp_path, "mlp", mlp_model)
    http_client, grpc_client = clients(tserve(tmp_path))
    for config in (http_client.get_model_config("mlp"), grpc_client.get_model_config("mlp", as_json=True)["config"]):
        assert int(config["max_batch_size"]) == 4
        assert "dynamic_batching" in config
    x = np.ones((4, 4), dtype=np.float32)
    np.testing.assert_allclose(kit.infer(grpc_client, "mlp", INPUT0=x).as_numpy("OUTPUT0"),
                               kit.reference(mlp_model, {"INPUT0": x})["OUTPUT0"], rtol=1e-5, atol=1e-6)


def test_an_existing_scheduler_and_max_batch_size_are_kept(kit: Any, tmp_path: Path) -> None:
    version_dir = kit.write_model(tmp_path, "double", kit.double_model())
    config = _completed(version_dir, "max_batch_size: 2\nsequence_batching {}")
    assert config.max_batch_size == 2
    assert config.WhichOneof("scheduling_choice") == "sequence_batching"


def test_a_model_without_a_variable_first_dimension_does_not_batch(kit: Any, tmp_path: Path, tserve: Any,
                                                                  clients: Any) -> None:
    model = kit.double_model(shape=[2, 3])
    kit.write_model(tmp_path, "fixed", model, 'name: "fixed"\nbackend: "onnxruntime"')
    http_client, _ = clients(tserve(tmp_path))
    config = http_client.get_model_config("fixed")
    assert config["max_batch_size"] == 0
    assert _tensors(config["input"]) == [("X", "TYPE_FP32", [2, 3])]
    assert _tensors(config["output"]) == [("Y", "TYPE_FP32", [2, 3])]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(kit.infer(http_client, "fixed", X=x).as_numpy("Y"), x + x)


def test_only_the_missing_outputs_are_completed(kit: Any, tmp_path: Path) -> None:
    version_dir = kit.write_model(tmp_path, "pair", kit.identity_model(["INT64", "BYTES"]))
    config = _completed(version_dir, """
        max_batch_size: 2
        input [{name: "IN_INT64", data_type: TYPE_INT64, dims: [2]}, {name: "IN_BYTES", data_type: TYPE_STRING,
               dims: [2]}]
    """)
    assert [t.name for t in config.input] == ["IN_INT64", "IN_BYTES"]
    assert [(t.name, DataType.Name(t.data_type), list(t.dims)) for t in config.output] == [
        ("OUT_INT64", "TYPE_INT64", [2]), ("OUT_BYTES", "TYPE_STRING", [2])]


def test_a_batch_only_tensor_becomes_dims_1_with_an_empty_reshape(kit: Any, tmp_path: Path, tserve: Any,
                                                                 clients: Any) -> None:
    model = kit.double_model("INT64", shape=["N"])
    kit.write_model(tmp_path, "vector", model)
    http_client, grpc_client = clients(tserve(tmp_path, backend_config=ONE))
    config = http_client.get_model_config("vector")
    assert config["input"][0]["dims"] == [1] and config["input"][0]["reshape"] == {"shape": []}
    for client in (http_client, grpc_client):
        got = kit.infer(client, "vector", X=np.array([[21]], dtype=np.int64)).as_numpy("Y")
        assert got.tolist() == [[42]]
