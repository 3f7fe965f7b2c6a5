"""The ``onnxruntime`` backend (platform ``onnxruntime_onnx``): auto-completes configs from ONNX files and
makes a Model per version, whose instances run ONNX Runtime sessions."""
from __future__ import annotations

from triton_serve.plugin import AutoCompleteOptions, Backend, Model, ModelSpec

from .autocomplete import auto_complete, needs_completion
from .instance import OnnxRuntimeModel
from .parameters import OnnxRuntimeParameters
from .session import open_probe_session
from .signature import read_signature


class OnnxRuntimeBackend(Backend):
    """Serves ``model.onnx`` files with ONNX Runtime, one session per instance.

    Options: ``default-max-batch-size``; model parameters: ``OnnxRuntimeParameters``. The plugin imports
    onnxruntime only when a model loads, so a server without it still starts and reports why this backend
    is unavailable.
    """

    name = "onnxruntime"
    platforms = ("onnxruntime_onnx",)
    default_model_filename = "model.onnx"
    instance_kinds = ("CPU", "GPU")
    Options = AutoCompleteOptions
    Parameters = OnnxRuntimeParameters
    options: AutoCompleteOptions

    def auto_complete_config(self, model: ModelSpec) -> None:
        if not model.config.platform:
            model.config.platform = self.platforms[0]  # Triton reports ONNX models as "onnxruntime_onnx"
        if needs_completion(model.config):
            signature = read_signature(open_probe_session(model))
            auto_complete(model.config, signature, model.name, self.options.default_max_batch_size)

    def create_model(self, spec: ModelSpec) -> Model:
        return OnnxRuntimeModel(self, spec)

    def unavailable_reason(self) -> str | None:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as error:
            return (f"onnxruntime cannot be imported ({error}); pip install 'triton-serve-onnx[cpu]' "
                    "(or [gpu] for CUDA)")
        return None
