"""Several requests in one execute (as a dynamic batcher hands them over), device kinds, and model parameters."""
from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence

import numpy as np
import pytest
import torch
import tritonclient.http as http
from google.protobuf import text_format

from triton_serve.plugin import (InferenceRequest, InferenceResponse, InstanceSpec, ModelConfig, ModelInstanceGroup,
                                 ModelSpec, Tensor, model_parameters)
from triton_serve_torch.backend import PyTorchBackend
from triton_serve_torch.instance import PyTorchModelInstance

RNG = np.random.default_rng(11)


def run_instance(version_dir, config_text: str, requests: Sequence[InferenceRequest], kind: str = "CPU",
                 backend: PyTorchBackend | None = None) -> list[InferenceResponse]:
    """Create and load the model and one instance directly (no server), execute, then unload them."""
    config = text_format.Parse(config_text, ModelConfig())
    spec = ModelSpec(version_dir.parent.name, 1, config, version_dir.parent, version_dir, "model.pt")
    group = ModelInstanceGroup(name="group", kind=ModelInstanceGroup.Kind.Value(f"KIND_{kind}"))
    backend = backend or PyTorchBackend()
    spec.parameters = model_parameters(backend, spec)  # as the core does
    model = backend.create_model(spec)

    async def run() -> list[InferenceResponse]:
        await model.load()
        instance = model.create_instance(InstanceSpec("group_0", group, 0, kind))
        await instance.load()
        try:
            return list(await instance.execute(requests))
        finally:
            await instance.unload()
            await model.unload()

    return asyncio.run(run())


def mlp_request(batch: int) -> tuple[InferenceRequest, np.ndarray, np.ndarray]:
    x = RNG.standard_normal((batch, 4)).astype(np.float32)
    y = RNG.standard_normal((batch, 3)).astype(np.float32)
    inputs = {"INPUT__0": Tensor("INPUT__0", "FP32", x.shape, x), "INPUT__1": Tensor("INPUT__1", "FP32", y.shape, y)}
    return InferenceRequest("mlp", inputs=inputs), x, y


@pytest.mark.parametrize("model_file", ["mlp_script", "mlp_exported"])
def test_requests_of_different_batch_sizes_execute_together(repo, model_files, kit, model_file):
    version = repo.add("mlp", getattr(model_files, model_file), None)
    made = [mlp_request(size) for size in (1, 3, 2)]
    responses = run_instance(version, kit.mlp_config(), [request for request, _, _ in made])
    assert len(responses) == 3
    for (_, x, y), response in zip(made, responses):
        logits, hidden = kit.reference(model_files.mlp, x, y)
        assert response.error is None
        np.testing.assert_allclose(response.output("OUTPUT__0").data, logits, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(response.output("OUTPUT__1").data, hidden, rtol=1e-5, atol=1e-6)
        assert response.output("OUTPUT__0").shape == (x.shape[0], 3)


class Difference(torch.nn.Module):
    """forward takes one Dict[str, Tensor]: Triton passes every input in it by name."""

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["minuend"] - inputs["subtrahend"]


def test_a_dict_argument_receives_every_input_by_name(repo, tmp_path, kit):
    version = repo.add("difference", kit.script(Difference(), tmp_path / "difference.pt"), None)
    config = """
        backend: "pytorch"
        input [ { name: "subtrahend" data_type: TYPE_INT32 dims: [2] }, { name: "minuend" data_type: TYPE_INT32 dims: [2] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [2] } ]
        """
    a, b = np.array([10, 20], np.int32), np.array([1, 2], np.int32)
    request = InferenceRequest("difference", inputs={"minuend": Tensor("minuend", "INT32", (2,), a),
                                                     "subtrahend": Tensor("subtrahend", "INT32", (2,), b)})
    (response,) = run_instance(version, config, [request])
    np.testing.assert_array_equal(response.output("OUTPUT__0").data, [9, 18])


def test_read_only_wire_buffers_are_accepted(repo, model_files, kit):
    version = repo.add("mlp", model_files.mlp_script, None)
    request, x, y = mlp_request(2)
    for tensor in request.inputs.values():  # as front-ends decode them: views of the request body
        tensor.data = np.frombuffer(tensor.data.tobytes(), np.float32).reshape(tensor.shape)
    (response,) = run_instance(version, kit.mlp_config(), [request])
    np.testing.assert_allclose(response.output("OUTPUT__0").data, kit.reference(model_files.mlp, x, y)[0],
                               rtol=1e-5, atol=1e-6)


def test_kind_model_keeps_the_saved_placement(repo, model_files, kit):
    version = repo.add("mlp", model_files.mlp_script, None)
    request, x, y = mlp_request(2)
    (response,) = run_instance(version, kit.mlp_config(), [request], kind="MODEL")
    np.testing.assert_allclose(response.output("OUTPUT__1").data, kit.reference(model_files.mlp, x, y)[1],
                               rtol=1e-5, atol=1e-6)


def test_parameters_are_applied(repo, model_files, kit):
    version = repo.add("mlp", model_files.mlp_script, None)
    parameters = {"DISABLE_OPTIMIZED_EXECUTION": "true", "INFERENCE_MODE": "false", "ENABLE_NVFUSER": "true",
                  "ENABLE_JIT_EXECUTOR": "false", "ENABLE_JIT_PROFILING": "false", "ENABLE_CACHE_CLEANING": "true",
                  "INTRA_OP_THREAD_COUNT": "1", "INTER_OP_THREAD_COUNT": str(torch.get_num_interop_threads())}
    extra = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    threads, executor, profiling = (torch.get_num_threads(), torch._C._jit_set_profiling_executor(True),
                                    torch._C._jit_set_profiling_mode(True))
    request, x, y = mlp_request(1)
    try:
        (response,) = run_instance(version, kit.mlp_config(extra=extra), [request])
        assert torch.get_num_threads() == 1
        assert torch._C._jit_set_profiling_executor(True) is False
        assert torch._C._jit_set_profiling_mode(True) is False
    finally:
        torch.set_num_threads(threads)
        torch._C._jit_set_profiling_executor(executor)
        torch._C._jit_set_profiling_mode(profiling)
    np.testing.assert_allclose(response.output("OUTPUT__0").data, kit.reference(model_files.mlp, x, y)[0],
                               rtol=1e-5, atol=1e-6)


def test_first_model_to_size_the_thread_pool_wins(repo, model_files, kit, caplog):
    backend = PyTorchBackend()
    threads = torch.get_num_threads()
    try:
        for name, count in (("first", 1), ("second", 2)):
            version = repo.add(name, model_files.mlp_script, None)
            extra = f'parameters {{ key: "INTRA_OP_THREAD_COUNT" value {{ string_value: "{count}" }} }}'
            run_instance(version, kit.mlp_config(extra=extra), [mlp_request(1)[0]], backend=backend)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert "INTRA_OP_THREAD_COUNT=2 is ignored: model 'first' set it to 1 first" in caplog.text


def test_forward_runs_with_the_thread_count_its_model_set(repo, model_files, tserve, kit, monkeypatch):
    """torch applies a new intra-op count only to threads that have not run torch yet: a model that sets
    INTRA_OP_THREAD_COUNT after another model ran still runs forward with it (on its instance's new thread)."""
    seen: dict[str, list[int]] = {"plain": [], "sized": []}
    run = PyTorchModelInstance.run

    def counting_run(self: PyTorchModelInstance, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen[self.model_name].append(torch.get_num_threads())
        return run(self, inputs)

    monkeypatch.setattr(PyTorchModelInstance, "run", counting_run)
    threads = torch.get_num_threads()
    count = 2 if threads == 1 else 1
    extra = f'parameters {{ key: "INTRA_OP_THREAD_COUNT" value {{ string_value: "{count}" }} }}'
    repo.add("plain", model_files.mlp_script, kit.mlp_config())
    repo.add("sized", model_files.mlp_script, kit.mlp_config(extra=extra))
    server = tserve(repo.root, model_control_mode="explicit")
    try:
        with http.InferenceServerClient(server.http_url) as client:
            for name in ("plain", "sized"):
                client.load_model(name)
                _, x, y = mlp_request(1)
                inputs = [http.InferInput(tensor, list(array.shape), "FP32")
                          for tensor, array in (("INPUT__0", x), ("INPUT__1", y))]
                inputs[0].set_data_from_numpy(x)
                inputs[1].set_data_from_numpy(y)
                client.infer(name, inputs)
    finally:
        torch.set_num_threads(threads)
    assert seen["plain"] == [threads] and seen["sized"] == [count]


def test_dynamic_batching_serves_concurrent_requests(repo, model_files, tserve, kit):
    pytest.importorskip("triton_serve_batching")
    repo.add("batched", model_files.mlp_script,
             kit.mlp_config(extra="dynamic_batching { max_queue_delay_microseconds: 2000000 }"))
    server = tserve(repo.root)
    made = [mlp_request(size) for size in (1, 2, 3)]

    def infer(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        with http.InferenceServerClient(server.http_url) as client:
            inputs = [http.InferInput("INPUT__0", list(x.shape), "FP32"), http.InferInput("INPUT__1", list(y.shape), "FP32")]
            inputs[0].set_data_from_numpy(x)
            inputs[1].set_data_from_numpy(y)
            return client.infer("batched", inputs).as_numpy("OUTPUT__0")

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(infer, x, y) for _, x, y in made]
        results = [future.result() for future in futures]
    for (_, x, y), got in zip(made, results):
        np.testing.assert_allclose(got, kit.reference(model_files.mlp, x, y)[0], rtol=1e-5, atol=1e-6)
    with http.InferenceServerClient(server.http_url) as client:
        stats = client.get_inference_statistics("batched")["model_stats"][0]
    assert stats["inference_count"] == 6
    assert stats["execution_count"] < 3  # at least two of the three requests ran as one batch
