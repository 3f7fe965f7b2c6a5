"""KIND_GPU instances run on CUDA where it works, and fail to load with a clear reason where it does not."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from triton_serve.plugin import (InstanceSpec, ModelConfig, ModelInstanceGroup, ModelSpec, ServerError, Status,
                                 visible_gpu_ids)
from triton_serve_onnx.parameters import OnnxRuntimeParameters
from triton_serve_onnx.session import open_instance_session

GPU_CONFIG = """
    backend: "onnxruntime"
    max_batch_size: 8
    input [{name: "INPUT0", data_type: TYPE_FP32, dims: [4]}]
    output [{name: "OUTPUT0", data_type: TYPE_FP32, dims: [3]}]
    instance_group [{kind: KIND_GPU, gpus: [0]}]
"""


@pytest.mark.gpu
def test_kind_gpu_runs_on_cuda(kit: Any, tmp_path: Path, tserve: Any, clients: Any, mlp_model: bytes,
                               cuda_works: bool) -> None:
    if not cuda_works:
        pytest.skip("onnxruntime cannot run CUDAExecutionProvider here")
    kit.write_model(tmp_path, "mlp", mlp_model, GPU_CONFIG)
    x = np.random.default_rng(6).standard_normal((3, 4)).astype(np.float32)
    for client in clients(tserve(tmp_path)):
        np.testing.assert_allclose(kit.infer(client, "mlp", INPUT0=x).as_numpy("OUTPUT0"),
                                   kit.reference(mlp_model, {"INPUT0": x})["OUTPUT0"], rtol=1e-3, atol=1e-4)


def test_kind_gpu_without_a_usable_gpu_fails_to_load(kit: Any, tmp_path: Path, tserve: Any, clients: Any,
                                                    mlp_model: bytes, cuda_works: bool) -> None:
    if cuda_works:
        pytest.skip("a GPU is usable here")
    kit.write_model(tmp_path, "mlp", mlp_model, GPU_CONFIG)
    http_client, _ = clients(tserve(tmp_path))
    reason = kit.reasons(http_client)["mlp"]
    if visible_gpu_ids():  # a GPU this onnxruntime cannot use (a CPU build, say): the backend refuses the fallback
        assert "needs ONNX Runtime's CUDAExecutionProvider" in reason
    else:  # no GPU at all: the core refuses the instance group first
        assert ("instance group mlp_0 of model mlp specifies invalid or unsupported gpu id 0" in reason
                and "no GPU is visible" in reason)
    assert not http_client.is_model_ready("mlp")


@pytest.mark.parametrize("accelerator", ["", 'gpu_execution_accelerator [{name: "tensorrt"}]'],
                         ids=["cuda", "tensorrt"])
def test_a_gpu_session_that_falls_back_to_cpu_is_refused(kit: Any, tmp_path: Path, mlp_model: bytes,
                                                         cuda_works: bool, accelerator: str) -> None:
    """onnxruntime-gpu without a GPU (or without CUDA libraries) quietly runs on the CPU: the backend says so."""
    if cuda_works:
        pytest.skip("a GPU is usable here")
    version_dir = kit.write_model(tmp_path, "mlp", mlp_model)
    config = text_format.Parse(GPU_CONFIG + f"optimization {{execution_accelerators {{{accelerator}}}}}",
                               ModelConfig())
    model = ModelSpec("mlp", 1, config, version_dir.parent, version_dir, "model.onnx",
                      parameters=OnnxRuntimeParameters())
    provider = "TensorrtExecutionProvider" if accelerator else "CUDAExecutionProvider"
    with pytest.raises(ServerError) as caught:
        open_instance_session(model, InstanceSpec("mlp_0_0", ModelInstanceGroup(), 0, "GPU", 0))
    assert caught.value.status is Status.UNAVAILABLE
    assert caught.value.message.startswith(f"instance 'mlp_0_0' of model 'mlp' needs ONNX Runtime's {provider}")
    assert "ONNX Runtime fell back to CPUExecutionProvider" in caught.value.message or \
        "which this onnxruntime build does not have" in caught.value.message


def test_gpu_libraries_are_loaded_from_the_nvidia_wheels_and_a_failure_is_only_logged(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """What onnxruntime.preload_dlls reports (by printing) goes to the log; an error in it does not stop the load,
    which check_enabled then judges by the providers the session really has."""
    import onnxruntime

    from triton_serve_onnx.session import load_gpu_libraries

    calls = []

    def preload_that_prints() -> None:
        calls.append("printed")
        print("Failed to load libcudart.so.13: not found")

    def preload_that_raises() -> None:
        calls.append("raised")
        raise RuntimeError("Invalid parameter of directory=None")

    caplog.set_level("INFO", logger="triton_serve_onnx.session")
    for preload in (preload_that_prints, preload_that_raises):
        monkeypatch.setattr(onnxruntime, "preload_dlls", preload, raising=False)
        load_gpu_libraries.__wrapped__()  # past the once-per-process cache
    assert calls == ["printed", "raised"]
    said = [record.getMessage() for record in caplog.records]
    assert said == ["onnxruntime.preload_dlls(): Failed to load libcudart.so.13: not found",
                    "onnxruntime.preload_dlls(): RuntimeError: Invalid parameter of directory=None"]
