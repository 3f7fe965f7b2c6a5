"""The ``tensorrt`` backend (platform ``tensorrt_plan``): serves TensorRT 10 plan files on NVIDIA GPUs."""
from __future__ import annotations

import functools

from triton_serve.plugin import Backend, Model, ModelInstanceGroup, ModelSpec, ServerError

from .autocomplete import complete_config
from .instance import TensorRTModel
from .plan_files import DEFAULT_PLAN_FILENAME, plan_path

INSTALL_COMMAND = "pip install 'triton-serve-tensorrt[tensorrt]'"


@functools.cache
def tensorrt_unavailable_reason() -> str | None:
    """Why TensorRT models cannot load on this machine (asked once per process), or None."""
    try:
        import tensorrt
    except (ImportError, OSError, RuntimeError) as error:  # OSError: TensorRT's native libraries are missing
        return (f"TensorRT is not installed (import tensorrt failed: {error}); install it on a machine with "
                f"an NVIDIA GPU with {INSTALL_COMMAND}")
    version = getattr(tensorrt, "__version__", "0")
    if int(version.split(".")[0]) < 10:
        return f"TensorRT {version} is installed, but this backend needs TensorRT 10 or newer ({INSTALL_COMMAND})"
    try:
        from . import cuda
    except (ImportError, OSError, RuntimeError) as error:
        return f"cuda-python is not installed (import cuda.bindings failed: {error}); install it with {INSTALL_COMMAND}"
    try:
        count = cuda.device_count()
    except ServerError as error:
        return f"no usable NVIDIA GPU: {error.message}"
    return None if count > 0 else "no NVIDIA GPU is visible (cudaGetDeviceCount found none)"


class TensorRTBackend(Backend):
    """Serves ``model.plan`` TensorRT engines. Each instance (KIND_GPU only) gets its own execution
    context and CUDA stream; the instances of a model version on one GPU share one engine (``TensorRTModel``)."""

    name = "tensorrt"
    platforms = ("tensorrt_plan",)
    default_model_filename = DEFAULT_PLAN_FILENAME
    instance_kinds = ("GPU",)  # the core turns KIND_AUTO into KIND_GPU

    def unavailable_reason(self) -> str | None:
        return tensorrt_unavailable_reason()

    def auto_complete_config(self, model: ModelSpec) -> None:
        """Fill inputs, outputs and max_batch_size from the engine (loaded on the model's first GPU)."""
        from .engine import describe_engine, load_engine

        device = _first_gpu(model)
        loaded = load_engine(plan_path(model, device), device)
        complete_config(model.name, model.config, describe_engine(loaded.engine))

    def create_model(self, spec: ModelSpec) -> Model:
        return TensorRTModel(self, spec)


def _first_gpu(model: ModelSpec) -> int:
    for group in model.config.instance_group:
        if group.kind == ModelInstanceGroup.KIND_GPU and group.gpus:
            return group.gpus[0]
    return 0
