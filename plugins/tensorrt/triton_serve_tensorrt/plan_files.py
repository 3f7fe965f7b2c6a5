"""Which plan file a model version loads on a GPU (``cc_model_filenames`` by compute capability)."""
from __future__ import annotations

from pathlib import Path

from triton_serve.plugin import ModelConfig, ModelSpec, ServerError

DEFAULT_PLAN_FILENAME = "model.plan"


def plan_filename(config: ModelConfig, compute_capability: str) -> str:
    """The file for a GPU of ``compute_capability`` ("8.6"): its ``cc_model_filenames`` entry, else
    ``default_model_filename``, else model.plan (Triton's order)."""
    return (config.cc_model_filenames.get(compute_capability) or config.default_model_filename
            or DEFAULT_PLAN_FILENAME)


def plan_path(model: ModelSpec, device: int) -> Path:
    """The plan file of ``model`` for GPU ``device``; CUDA is asked for the GPU's compute
    capability only when the config has ``cc_model_filenames``."""
    capability = ""
    if model.config.cc_model_filenames:
        from . import cuda
        capability = cuda.compute_capability(device)
    path = model.version_dir / plan_filename(model.config, capability)
    if not path.is_file():
        raise ServerError(f"model '{model.name}' version {model.version}: plan file '{path.name}' does not exist "
                          f"in {model.version_dir}")
    return path
