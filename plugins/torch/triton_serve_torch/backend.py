"""The ``pytorch`` backend (platforms ``pytorch_libtorch``: TorchScript ``model.pt`` and exported ``model.pt2``;
``torch_aoti``: AOTInductor packages ``model.pt2``).

torch is imported only once a model is served (the modules that need it are imported inside the
methods), so that a server without torch still starts and ``unavailable_reason`` can say why.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triton_serve.plugin import AutoCompleteOptions, Backend, Model, ModelSpec, ServerError

from .options import TorchModelOptions

if TYPE_CHECKING:
    from .threads import ThreadPoolSizes


class PyTorchBackend(Backend):
    """Serves ``backend: "pytorch"`` / ``platform: "pytorch_libtorch"`` models with torch in this process.

    Options: ``default-max-batch-size``, the ``max_batch_size`` auto-complete gives an exported program whose
    tensors all have a dynamic first dim. Model parameters: ``TorchModelOptions``.
    """

    name = "pytorch"
    platforms = ("pytorch_libtorch", "torch_aoti")
    default_model_filename = "model.pt"
    other_model_filenames = ("model.pt2",)
    instance_kinds = ("CPU", "GPU", "MODEL")
    Options = AutoCompleteOptions
    Parameters = TorchModelOptions
    options: AutoCompleteOptions

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
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
        from .modelfile import (AOTI_PLATFORM, EXPORTED_SUFFIX, describe_exported, error_summary, model_file,
                                read_exported_program)

        path = model_file(model)
        if model.config.platform == AOTI_PLATFORM:  # as Triton: the config lists an AOTInductor package's tensors
            return
        if path.suffix != EXPORTED_SUFFIX or not path.is_file() or (model.config.input and model.config.output):
            return
        try:
            inputs, outputs = describe_exported(read_exported_program(path))
        except Exception as error:  # torch raises RuntimeError, BadZipFile, KeyError... for unreadable files
            raise ServerError(f"pytorch model '{model.name}': cannot load '{path.name}' as an exported program: "
                              f"{error_summary(error)}") from None
        fill_config(model.name, model.config, inputs, outputs, self.options.default_max_batch_size)

    def create_model(self, spec: ModelSpec) -> Model:
        from .model import PyTorchModel

        return PyTorchModel(self, spec)

    def thread_pools(self) -> ThreadPoolSizes:
        """What sizes torch's process-wide thread pools for this backend's models (the first model to set a
        size wins); made on first use, since it imports torch."""
        from .threads import ThreadPoolSizes

        if self._thread_pools is None:
            self._thread_pools = ThreadPoolSizes()
        return self._thread_pools
