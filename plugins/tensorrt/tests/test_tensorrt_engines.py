"""Real TensorRT engines built at test time, loaded, described and served (needs TensorRT 10 and a GPU).

Outputs are compared with the same network computed by NumPy: relu(x @ W + b)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from triton_serve.plugin import InferenceRequest, InstanceSpec, ModelConfig, ModelSpec, Tensor

trt = pytest.importorskip("tensorrt", reason="TensorRT is not installable in this workplace")

from triton_serve_tensorrt.backend import TensorRTBackend

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(TensorRTBackend().unavailable_reason() is not None,
                                 reason=f"TensorRT cannot run here: {TensorRTBackend().unavailable_reason()}")]

WEIGHTS = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [-2.0, 1.0, 0.75], [0.1, 0.2, 0.3]], dtype=np.float32)
BIAS = np.array([[0.1, -0.2, 0.3]], dtype=np.float32)
LINEAR_CONFIG = """
platform: "tensorrt_plan"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] }} ]
"""


def expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ WEIGHTS + BIAS, 0).astype(np.float32)


def build_linear_plan(path: Path, batch_profiles: Sequence[tuple[int, int, int]] = ((1, 4, 8),)) -> Path:
    """Build relu(INPUT0 @ W + b), INPUT0 FP32 [-1, 4], with one profile per (min, opt, max) batch."""
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = builder.create_network(0)
    x = network.add_input("INPUT0", trt.float32, (-1, 4))
    weights = network.add_constant(WEIGHTS.shape, trt.Weights(WEIGHTS))
    bias = network.add_constant(BIAS.shape, trt.Weights(BIAS))
    product = network.add_matrix_multiply(x, trt.MatrixOperation.NONE, weights.get_output(0), trt.MatrixOperation.NONE)
    total = network.add_elementwise(product.get_output(0), bias.get_output(0), trt.ElementWiseOperation.SUM)
    relu = network.add_activation(total.get_output(0), trt.ActivationType.RELU)
    output = relu.get_output(0)
    output.name = "OUTPUT0"
    network.mark_output(output)
    config = builder.create_builder_config()
    config.clear_flag(trt.BuilderFlag.TF32)  # exact FP32 so NumPy is a fair reference
    for low, best, high in batch_profiles:
        profile = builder.create_optimization_profile()
        profile.set_shape("INPUT0", (low, 4), (best, 4), (high, 4))
        config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None, "TensorRT failed to build the test engine"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(plan))
    return path


def add_model(repo: Path, name: str, config: str | None,
              profiles: Sequence[tuple[int, int, int]] = ((1, 4, 8),)) -> Path:
    plan = build_linear_plan(repo / name / "1" / "model.plan", profiles)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    return plan


def batch(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 4)).astype(np.float32)


def request(x: np.ndarray) -> InferenceRequest:
    return InferenceRequest("linear", 1, inputs={"INPUT0": Tensor("INPUT0", "FP32", x.shape, x)})


def test_a_built_engine_is_described_exactly(tmp_path: Path) -> None:
    from triton_serve_tensorrt.engine import describe_engine, load_engine

    plan = build_linear_plan(tmp_path / "model.plan", [(1, 4, 8), (9, 16, 32)])
    description = describe_engine(load_engine(plan, 0).engine)
    assert description.num_profiles == 2
    (source,), (sink,) = description.inputs, description.outputs
    assert (source.name, source.tensorrt_type, source.shape) == ("INPUT0", "FLOAT", (-1, 4))
    assert not source.is_shape_tensor
    assert [(p.min, p.opt, p.max) for p in source.profiles] == [((1, 4), (4, 4), (8, 4)), ((9, 4), (16, 4), (32, 4))]
    assert (sink.name, sink.tensorrt_type, sink.shape) == ("OUTPUT0", "FLOAT", (-1, 3))


def test_instances_run_batches_of_several_requests_and_share_the_engine(tmp_path: Path) -> None:
    plan = build_linear_plan(tmp_path / "linear" / "1" / "model.plan", [(1, 4, 8), (9, 16, 32)])
    group = 'instance_group [ { name: "g" kind: KIND_GPU count: 2 gpus: [ 0 ] profile: ["0", "1"] } ]'
    config = text_format.Parse(LINEAR_CONFIG.format(max_batch=32) + 'name: "linear"\n' + group, ModelConfig())
    spec = ModelSpec("linear", 1, config, tmp_path / "linear", tmp_path / "linear" / "1", "model.plan")
    model = TensorRTBackend().create_model(spec)
    instances = [model.create_instance(InstanceSpec(f"g_{i}", config.instance_group[0], i, "GPU", 0))
                 for i in range(2)]

    async def scenario() -> None:
        await model.load()
        await asyncio.gather(*(instance.load() for instance in instances))
        assert model.engines.users(plan, 0) == 2
        for sizes in ((1, 2, 3), (8, 12), (32,)):  # profile 0, then profile 1 (20 rows), then 32 rows
            inputs = [batch(rows, seed) for seed, rows in enumerate(sizes)]
            responses = await instances[0].execute([request(x) for x in inputs])
            for x, response in zip(inputs, responses):
                out = response.output("OUTPUT0")
                assert out is not None and out.shape == (len(x), 3) and out.datatype == "FP32"
                np.testing.assert_allclose(out.data, expected(x), rtol=1e-5, atol=1e-6)
        second = await instances[1].execute([request(batch(5, 9))])
        np.testing.assert_allclose(second[0].outputs[0].data, expected(batch(5, 9)), rtol=1e-5, atol=1e-6)
        await asyncio.gather(*(instance.unload() for instance in instances))
        assert model.engines.users(plan, 0) == 0
        await model.unload()

    asyncio.run(scenario())


@pytest.fixture
def clients() -> Any:
    made: list[Any] = []

    def make(server: Any) -> tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient]:
        pair = (httpclient.InferenceServerClient(server.http_url, concurrency=4),
                grpcclient.InferenceServerClient(server.grpc_url))
        made.extend(pair)
        return pair

    yield make
    for client in made:
        client.close()


def infer(client: Any, module: Any, model: str, x: np.ndarray) -> np.ndarray:
    tensor = module.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor]).as_numpy("OUTPUT0")


def test_auto_complete_and_inference_over_http_and_grpc(
        repo: Path, tserve: Callable[..., Any], clients: Any) -> None:
    add_model(repo, "linear", None)
    http, grpc = clients(tserve(repo))
    config = http.get_model_config("linear")
    assert config["platform"] == "tensorrt_plan" and config["backend"] == "tensorrt"
    assert config["max_batch_size"] == 8
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("INPUT0", "TYPE_FP32", [4])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("OUTPUT0", "TYPE_FP32", [3])]
    assert config["instance_group"][0]["kind"] == "KIND_GPU"
    x = batch(5, 1)
    np.testing.assert_allclose(infer(http, httpclient, "linear", x), expected(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(infer(grpc, grpcclient, "linear", x), expected(x), rtol=1e-5, atol=1e-6)


def test_profiles_chosen_per_request_through_the_server(
        repo: Path, tserve: Callable[..., Any], clients: Any) -> None:
    add_model(repo, "linear", LINEAR_CONFIG.format(max_batch=32)
              + 'instance_group [ { kind: KIND_GPU count: 2 profile: ["0", "1"] } ]', [(1, 4, 8), (9, 16, 32)])
    http, grpc = clients(tserve(repo))
    for rows in (1, 8, 9, 20, 32):
        x = batch(rows, rows)
        np.testing.assert_allclose(infer(http, httpclient, "linear", x), expected(x), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(infer(grpc, grpcclient, "linear", x), expected(x), rtol=1e-5, atol=1e-6)


def test_broken_models_fail_to_load_with_clear_reasons(
        repo: Path, tserve: Callable[..., Any], clients: Any) -> None:
    (repo / "garbage" / "1").mkdir(parents=True)
    (repo / "garbage" / "config.pbtxt").write_text(LINEAR_CONFIG.format(max_batch=8))
    (repo / "garbage" / "1" / "model.plan").write_bytes(b"this is not a serialized engine")
    add_model(repo, "on_cpu", LINEAR_CONFIG.format(max_batch=8) + "instance_group [ { kind: KIND_CPU } ]")
    wrong_type = LINEAR_CONFIG.format(max_batch=8).replace("TYPE_FP32 dims: [ 3 ]", "TYPE_FP16 dims: [ 3 ]")
    add_model(repo, "wrong_type", wrong_type + "instance_group [ { kind: KIND_GPU } ]")
    add_model(repo, "too_big", LINEAR_CONFIG.format(max_batch=64))
    add_model(repo, "served", LINEAR_CONFIG.format(max_batch=8))
    http, _ = clients(tserve(repo))
    reasons = {entry["name"]: entry.get("reason", "") for entry in http.get_model_repository_index()}
    assert "'model.plan' is not a TensorRT engine that TensorRT" in reasons["garbage"]
    assert "TensorRT engines run only on GPUs; use kind: KIND_GPU" in reasons["on_cpu"]
    assert ("output 'OUTPUT0': data_type is TYPE_FP16 in the config, but the engine's tensor is TYPE_FP32"
            in reasons["wrong_type"])
    assert "max_batch_size is 64" in reasons["too_big"]
    assert http.is_model_ready("served")
    x = batch(2, 3)
    np.testing.assert_allclose(infer(http, httpclient, "served", x), expected(x), rtol=1e-5, atol=1e-6)


def test_dynamic_batching_concatenates_concurrent_requests(
        repo: Path, tserve: Callable[..., Any], clients: Any) -> None:
    pytest.importorskip("triton_serve_batching", reason="the dynamic batcher plugin is not installed")
    add_model(repo, "linear", LINEAR_CONFIG.format(max_batch=8)
              + "dynamic_batching { max_queue_delay_microseconds: 2000000 }")
    http, _ = clients(tserve(repo))
    inputs = [batch(rows, rows) for rows in (1, 2, 3)]
    pending = []
    for x in inputs:
        tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        pending.append(http.async_infer("linear", [tensor]))
    for x, future in zip(inputs, pending):
        np.testing.assert_allclose(future.get_result().as_numpy("OUTPUT0"), expected(x), rtol=1e-5, atol=1e-6)
