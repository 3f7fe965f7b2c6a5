"""The ``pytorch`` backend (platform ``pytorch_libtorch``): TorchScript ``model.pt`` and exported ``model.pt2``.

torch is imported only once a model is served (the modules that need it are imported inside the
methods), so that a server without torch still starts and ``unavailable_reason`` can say why.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from triton_serve.plugin import Backend, DataType, InstanceSpec, ModelInstance, ModelSpec, ServerError, Status

from .options import TorchModelOptions

if TYPE_CHECKING:
    import torch

    from .threads import ThreadPoolSizes

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's default for --backend-config=<backend>,default-max-batch-size


class PyTorchBackend(Backend):
    """Serves ``backend: "pytorch"`` / ``platform: "pytorch_libtorch"`` models with torch in this process.

    Backend options (``--backend-config=pytorch,<key>=<value>``): ``default-max-batch-size``, the
    ``max_batch_size`` auto-complete gives an exported program whose tensors all have a dynamic first dim.
    Model parameters: see options.py and the README.
    """

    name = "pytorch"
    platforms = ("pytorch_libtorch",)
    default_model_filename = "model.pt"
    other_model_filenames = ("model.pt2",)
    instance_kinds = ("CPU", "GPU", "MODEL")

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        text = self.options.get("default-max-batch-size", str(DEFAULT_MAX_BATCH_SIZE))
        if not text.isdigit():
            raise ServerError(f"--backend-config=pytorch,default-max-batch-size must be a whole number, got '{text}'")
        self.default_max_batch_size = int(text)
        self._thread_pools: ThreadPoolSizes | None = None

    def unavailable_reason(self) -> str | None:
        try:
            import torch  # noqa: F401
        except (ImportError, OSError) as error:
            return f"torch cannot be imported ({error}); install it with 'pip install torch'"
        return None

    def auto_complete_config(self, model: ModelSpec) -> None:
        """Exported programs describe their tensors: fill inputs, outputs and max_batch_size from them.
        TorchScript models do not (nor does Triton fill them): their config must list the tensors."""
        from .exported_config import fill_config
        from .modelfile import EXPORTED_SUFFIX, describe_exported, error_summary, model_file, read_exported_program

        path = model_file(model)
        if path.suffix != EXPORTED_SUFFIX or not path.is_file() or (model.config.input and model.config.output):
            return
        try:
            inputs, outputs = describe_exported(read_exported_program(path))
        except Exception as error:  # torch raises RuntimeError, BadZipFile, KeyError... for unreadable files
            raise ServerError(f"pytorch model '{model.name}': cannot load '{path.name}' as an exported program: "
                              f"{error_summary(error)}") from None
        fill_config(model.name, model.config, inputs, outputs, self.default_max_batch_size)

    def create_instance(self, model: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        from .instance import PyTorchModelInstance
        from .modelfile import EXPORTED_SUFFIX, model_file
        from .threads import ThreadPoolSizes

        options = TorchModelOptions.from_config(model.name, model.config)
        path = model_file(model)
        if not path.is_file():
            raise ServerError(f"pytorch model '{model.name}' version {model.version} has no model file "
                              f"'{path.name}' in {model.version_dir}", Status.NOT_FOUND)
        _check_tensors(model, exported=path.suffix == EXPORTED_SUFFIX)
        device = _device(model, instance)
        if self._thread_pools is None:
            self._thread_pools = ThreadPoolSizes()
        self._thread_pools.apply(model.name, options)
        if options.enable_nvfuser is not None:
            log.info("pytorch model '%s': ENABLE_NVFUSER is ignored (PyTorch no longer ships NvFuser)", model.name)
        if options.enable_weight_sharing:
            log.info("pytorch model '%s': ENABLE_WEIGHT_SHARING is ignored; each instance loads its own copy",
                     model.name)
        return PyTorchModelInstance(model, instance, path, options, device)


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
    import torch

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
