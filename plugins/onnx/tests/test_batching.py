"""Several requests in one execute are concatenated along the batch dimension and split back, one response each."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from triton_serve.plugin import (InferenceRequest, InferenceResponse, InstanceSpec, ModelConfig, ModelInstanceGroup,
                                 ModelSpec, RequestedOutput, Tensor, datatype_of_config)
from triton_serve_onnx.backend import OnnxRuntimeBackend
from triton_serve_onnx.parameters import OnnxRuntimeParameters

MLP_CONFIG = """
    max_batch_size: 8
    input [{name: "INPUT0", data_type: TYPE_FP32, dims: [4]}]
    output [{name: "OUTPUT0", data_type: TYPE_FP32, dims: [3]}]
"""


def _execute(version_dir: Path, config_text: str, requests: list[dict[str, np.ndarray]],
             wanted: list[list[str]] | None = None) -> list[InferenceResponse]:
    """Load one CPU instance of the model and execute all ``requests`` (input name -> array) as one batch."""
    config = text_format.Parse(config_text, ModelConfig())
    model = ModelSpec(version_dir.parent.name, 1, config, version_dir.parent, version_dir, "model.onnx",
                      parameters=OnnxRuntimeParameters())
    types = {spec.name: datatype_of_config(spec.data_type).name for spec in config.input}

    async def run() -> list[InferenceResponse]:
        loaded = OnnxRuntimeBackend().create_model(model)
        await loaded.load()
        instance = loaded.create_instance(InstanceSpec("m_0_0", ModelInstanceGroup(), 0, "CPU"))
        await instance.load()
        batch = [InferenceRequest(model.name, inputs={name: Tensor(name, types[name], array.shape, array)
                                                      for name, array in arrays.items()},
                                  outputs=[RequestedOutput(name) for name in (wanted or [[]] * len(requests))[i]])
                 for i, arrays in enumerate(requests)]
        try:
            return list(await instance.execute(batch))
        finally:
            await instance.unload()
            await loaded.unload()

    return asyncio.run(run())


def test_requests_of_different_batch_sizes_get_their_own_rows(kit: Any, tmp_path: Path, mlp_model: bytes) -> None:
    version_dir = kit.write_model(tmp_path, "mlp", mlp_model)
    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal((rows, 4)).astype(np.float32) for rows in (1, 3, 2)]
    responses = _execute(version_dir, MLP_CONFIG, [{"INPUT0": x} for x in inputs])
    assert len(responses) == 3
    for x, response in zip(inputs, responses, strict=True):
        output = response.output("OUTPUT0")
        assert output is not None and output.datatype == "FP32" and output.shape == (len(x), 3)
        np.testing.assert_allclose(output.data, kit.reference(mlp_model, {"INPUT0": x})["OUTPUT0"],
                                   rtol=1e-5, atol=1e-6)


def test_string_requests_are_batched_and_answered_as_bytes(kit: Any, tmp_path: Path) -> None:
    version_dir = kit.write_model(tmp_path, "shout", kit.strings_model())
    config = """
        max_batch_size: 4
        input [{name: "TEXT", data_type: TYPE_STRING, dims: [2]}]
        output [{name: "SHOUT", data_type: TYPE_STRING, dims: [2]}]
    """
    first = np.array([[b"a", "ü".encode()]], dtype=np.object_)
    second = np.array([[b"b", b"c"], [b"", b"d"]], dtype=np.object_)
    responses = _execute(version_dir, config, [{"TEXT": first}, {"TEXT": second}])
    assert [response.output("SHOUT").data.tolist() for response in responses] == [  # type: ignore[union-attr]
        [[b"a!", "ü!".encode()]], [[b"b!", b"c!"], [b"!", b"d!"]]]


def test_each_request_gets_only_the_outputs_it_asked_for(kit: Any, tmp_path: Path) -> None:
    version_dir = kit.write_model(tmp_path, "pair", kit.identity_model(["INT16", "UINT64"]))
    config = """
        max_batch_size: 4
        input [{name: "IN_INT16", data_type: TYPE_INT16, dims: [2]}, {name: "IN_UINT64", data_type: TYPE_UINT64,
               dims: [2]}]
        output [{name: "OUT_INT16", data_type: TYPE_INT16, dims: [2]}, {name: "OUT_UINT64", data_type: TYPE_UINT64,
                dims: [2]}]
    """
    requests = [{"IN_INT16": np.full((rows, 2), rows, np.int16), "IN_UINT64": np.full((rows, 2), 2**63 + rows,
                                                                                      np.uint64)} for rows in (2, 1)]
    responses = _execute(version_dir, config, requests, wanted=[["OUT_UINT64"], []])
    assert [tensor.name for tensor in responses[0].outputs] == ["OUT_UINT64"]
    assert responses[0].outputs[0].data.tolist() == [[2**63 + 2] * 2] * 2
    assert {tensor.name: tensor.data.tolist() for tensor in responses[1].outputs} == {
        "OUT_INT16": [[1, 1]], "OUT_UINT64": [[2**63 + 1] * 2]}


def test_dynamic_batcher_joins_concurrent_requests(kit: Any, tmp_path: Path, tserve: Any, clients: Any,
                                                  mlp_model: bytes) -> None:
    pytest.importorskip("triton_serve_batching")
    kit.write_model(tmp_path, "mlp", mlp_model, 'backend: "onnxruntime"' + MLP_CONFIG
                    + "dynamic_batching { max_queue_delay_microseconds: 2000000 }")
    http_client, grpc_client = clients(tserve(tmp_path))
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((rows, 4)).astype(np.float32) for rows in (1, 2, 3)]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda x: kit.infer(grpc_client, "mlp", INPUT0=x).as_numpy("OUTPUT0"), inputs))
    for x, got in zip(inputs, results, strict=True):
        np.testing.assert_allclose(got, kit.reference(mlp_model, {"INPUT0": x})["OUTPUT0"], rtol=1e-5, atol=1e-6)
    stats = http_client.get_inference_statistics("mlp")["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (6, 1)
