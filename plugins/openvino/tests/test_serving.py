"""Serving OpenVINO models end to end: tritonclient HTTP and gRPC against OpenVINO run in-process."""
from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_serve.testing import RunningServer

MLP_CONFIG = """
    backend: "openvino"
    max_batch_size: 8
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [4] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [3] }]
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path], kit: Any) -> Iterator[RunningServer]:
    """One server for the module's models (see each test for what its model shows)."""
    repo = tmp_path_factory.mktemp("serving")
    bin_of = {name: path.with_suffix(".bin") for name, path in models.items() if name.endswith("_xml")}
    ir = {"mlp": {"model.xml": models["mlp_xml"], "model.bin": bin_of["mlp_xml"]},
          "static": {"model.xml": models["static_xml"], "model.bin": bin_of["static_xml"]},
          "ints": {"model.xml": models["ints_xml"], "model.bin": bin_of["ints_xml"]}}
    kit.write_model(repo, "mlp_auto", ir["mlp"], 'backend: "openvino"\n')
    kit.write_model(repo, "mlp_no_config", ir["mlp"])
    kit.write_model(repo, "ints_auto", ir["ints"], 'backend: "openvino"\n')
    kit.write_model(repo, "mlp_onnx", {"model.onnx": models["mlp_onnx"]},
                    MLP_CONFIG + 'default_model_filename: "model.onnx"\n')
    kit.write_model(repo, "static_batch", ir["static"], MLP_CONFIG)
    kit.write_model(repo, "mlp_two", ir["mlp"], MLP_CONFIG + """
        instance_group [{ count: 2, kind: KIND_CPU }]
        parameters [{ key: "NUM_STREAMS", value: { string_value: "1" } },
                    { key: "PERFORMANCE_HINT", value: { string_value: "latency" } },
                    { key: "INFERENCE_NUM_THREADS", value: { string_value: "1" } }]
    """)
    kit.write_model(repo, "mlp_unbatched", ir["mlp"], """
        backend: "openvino"
        input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [-1, 4] }]
    """)
    server = kit.start_server(repo)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(served: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(served.http_url, network_timeout=60)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(served: RunningServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(served.grpc_url)
    yield client
    client.close()


def infer(client: Any, model: str, **arrays: np.ndarray) -> Any:
    """Infer with one input per keyword; the module of ``client`` (http or grpc) builds the inputs."""
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), module.np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs)


def test_every_model_loads(http: httpclient.InferenceServerClient) -> None:
    index = {entry["name"]: entry for entry in http.get_model_repository_index()}
    assert {name: entry.get("state") for name, entry in index.items()} == dict.fromkeys(index, "READY")
    assert len(index) == 7


def test_auto_complete_fills_batching_and_tensors_from_the_model(http: httpclient.InferenceServerClient) -> None:
    for model in ("mlp_auto", "mlp_no_config"):
        config = http.get_model_config(model)
        assert config["backend"] == "openvino"
        assert config["max_batch_size"] == 4  # Triton's default-max-batch-size: the first dims are dynamic
        assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("INPUT0", "TYPE_FP32", [4])]
        assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("OUTPUT0", "TYPE_FP32", [3])]
    config = http.get_model_config("ints_auto")
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("A", "TYPE_INT32", [3]), ("B", "TYPE_INT32", [3]), ("H", "TYPE_FP16", [3])]
    assert [(t["name"], t["data_type"]) for t in config["output"]] == [
        ("SUM", "TYPE_INT32"), ("GREATER", "TYPE_BOOL"), ("WIDE", "TYPE_INT64"), ("HALF", "TYPE_FP16")]


def test_a_model_that_declares_its_batch_dimension_is_not_given_max_batch_size(
        http: httpclient.InferenceServerClient, models: dict[str, Path], kit: Any) -> None:
    config = http.get_model_config("mlp_unbatched")
    assert config["max_batch_size"] == 0
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("OUTPUT0", [-1, 3])]
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    got = infer(http, "mlp_unbatched", INPUT0=x).as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, kit.reference(models["mlp_xml"], {"INPUT0": x})["OUTPUT0"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["mlp_auto", "mlp_no_config", "mlp_onnx"])
def test_outputs_match_openvino_in_process(protocol: str, model: str, request: pytest.FixtureRequest,
                                           models: dict[str, Path], kit: Any) -> None:
    client = request.getfixturevalue(protocol)
    x = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)
    got = infer(client, model, INPUT0=x).as_numpy("OUTPUT0")
    model_file = models["mlp_onnx"] if model == "mlp_onnx" else models["mlp_xml"]
    expected = kit.reference(model_file, {"INPUT0": x})["OUTPUT0"]
    assert got.shape == (3, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_integer_bool_and_fp16_tensors(protocol: str, request: pytest.FixtureRequest,
                                       models: dict[str, Path], kit: Any) -> None:
    client = request.getfixturevalue(protocol)
    rng = np.random.default_rng(3)
    arrays = {"A": rng.integers(-1000, 1000, (2, 3), dtype=np.int32),
              "B": rng.integers(-1000, 1000, (2, 3), dtype=np.int32),
              "H": rng.normal(size=(2, 3)).astype(np.float16)}
    result = infer(client, "ints_auto", **arrays)
    expected = kit.reference(models["ints_xml"], arrays)
    for name, dtype in (("SUM", np.int32), ("GREATER", np.bool_), ("WIDE", np.int64), ("HALF", np.float16)):
        got = result.as_numpy(name)
        assert got.dtype == dtype, name
        np.testing.assert_array_equal(got, expected[name], err_msg=name)
    np.testing.assert_array_equal(result.as_numpy("SUM"), arrays["A"] + arrays["B"])
    np.testing.assert_array_equal(result.as_numpy("WIDE"), arrays["A"].astype(np.int64) * arrays["B"])


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_a_model_saved_with_batch_1_serves_every_batch_size(batch: int, http: httpclient.InferenceServerClient,
                                                            models: dict[str, Path], kit: Any) -> None:
    x = np.random.default_rng(batch).normal(size=(batch, 4)).astype(np.float32)
    got = infer(http, "static_batch", INPUT0=x).as_numpy("OUTPUT0")
    # the reference runs the unchanged batch-1 model once per row
    rows = [kit.reference(models["static_xml"], {"INPUT0": x[i:i + 1]})["OUTPUT0"] for i in range(batch)]
    np.testing.assert_allclose(got, np.concatenate(rows), rtol=1e-5, atol=1e-6)


def test_two_instances_compiled_with_the_parameters_serve_concurrent_requests(
        served: RunningServer, http: httpclient.InferenceServerClient, models: dict[str, Path], kit: Any) -> None:
    instances = served.server.repository.get_version("mlp_two").instances
    assert len(instances) == 2
    for instance in instances:
        properties = {key: str(instance.compiled.get_property(key))
                      for key in ("PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS")}
        assert properties == {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": "1"}
    assert instances[0].compiled is not instances[1].compiled

    rng = np.random.default_rng(4)
    batches = [rng.normal(size=(size, 4)).astype(np.float32) for size in (1, 2, 5, 8, 3, 4, 7, 6)]

    def run(x: np.ndarray) -> np.ndarray:
        client = httpclient.InferenceServerClient(served.http_url)
        try:
            return infer(client, "mlp_two", INPUT0=x).as_numpy("OUTPUT0")
        finally:
            client.close()

    with ThreadPoolExecutor(len(batches)) as pool:
        results = list(pool.map(run, batches))
    for x, got in zip(batches, results, strict=True):
        np.testing.assert_allclose(got, kit.reference(models["mlp_xml"], {"INPUT0": x})["OUTPUT0"],
                                   rtol=1e-5, atol=1e-6)
