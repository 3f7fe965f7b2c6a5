"""One version of a PyTorch model: its parameters, model file and tensors checked once for its instances."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from triton_serve.plugin import DataType, InstanceSpec, Model, ModelInstance, ModelSpec, ServerError, Status

from .instance import PyTorchModelInstance
from .modelfile import EXPORTED_SUFFIX, model_file
from .options import TorchModelOptions

if TYPE_CHECKING:
    from .backend import PyTorchBackend

log = logging.getLogger(__name__)


class PyTorchModel(Model):
    """Parses the model's parameters and checks its file and tensors on load; sizes torch's thread pools
    (process-wide, so the backend's first model to size one wins). Each instance loads its own copy."""

    backend: PyTorchBackend

    def __init__(self, backend: PyTorchBackend, spec: ModelSpec) -> None:
        super().__init__(backend, spec)
        self.options: TorchModelOptions = spec.parameters
        self.path = model_file(spec)

    async def load(self) -> None:
        spec = self.spec
        if not self.path.is_file():
            raise ServerError(f"pytorch model '{spec.name}' version {spec.version} has no model file "
                              f"'{self.path.name}' in {spec.version_dir}", Status.NOT_FOUND)
        _check_tensors(spec, exported=self.path.suffix == EXPORTED_SUFFIX)
        self.backend.thread_pools().apply(spec.name, self.options)
        if self.options.enable_nvfuser is not None:
            log.info("pytorch model '%s': ENABLE_NVFUSER is ignored (PyTorch no longer ships NvFuser)", spec.name)
        if self.options.enable_weight_sharing:
            log.info("pytorch model '%s': ENABLE_WEIGHT_SHARING is ignored; each instance loads its own copy",
                     spec.name)

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return PyTorchModelInstance(self, instance, _device(self.spec, instance))


def _check_tensors(model: ModelSpec, exported: bool) -> None:
    config = model.config
    if not config.input or not config.output:
        hint = ("auto-complete fills them from a model.pt2 unless the server runs with "
                "--disable-auto-complete-config or --strict-model-config" if exported else
                "TorchScript files do not describe their tensors, so the config must list them")
        raise ServerError(f"pytorch model '{model.name}': config.pbtxt must list the model's inputs and outputs; "
                          f"{hint}")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            if tensor.data_type == DataType.TYPE_STRING:
                raise ServerError(f"pytorch model '{model.name}': {kind} '{tensor.name}' is TYPE_STRING; the "
                                  "pytorch backend serves tensors only (List[str] arguments are not supported)",
                                  Status.UNSUPPORTED)


def _device(model: ModelSpec, instance: InstanceSpec) -> torch.device | None:
    """Where the instance's parameters go: the CPU, its GPU, or (KIND_MODEL) wherever they were saved."""
    if instance.kind == "MODEL":
        return None
    if instance.kind != "GPU":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ServerError(f"pytorch model '{model.name}' instance '{instance.name}' is KIND_GPU (GPU "
                          f"{instance.device_id}), but torch {torch.__version__} cannot use CUDA on this machine; "
                          "use KIND_CPU or install a CUDA build of torch", Status.UNAVAILABLE)
    if instance.device_id >= torch.cuda.device_count():
        raise ServerError(f"pytorch model '{model.name}' instance '{instance.name}' asks for GPU "
                          f"{instance.device_id}, but torch sees {torch.cuda.device_count()} GPU(s)",
                          Status.UNAVAILABLE)
    return torch.device("cuda", instance.device_id)
