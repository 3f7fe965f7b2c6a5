"""The ``onnxruntime`` backend (platform ``onnxruntime_onnx``): auto-completes configs from ONNX files and
makes ONNX Runtime instances."""
from __future__ import annotations

from triton_serve.plugin import Backend, InstanceSpec, ModelInstance, ModelSpec, ServerError

from .autocomplete import DEFAULT_MAX_BATCH_SIZE, auto_complete, needs_completion
from .instance import OnnxRuntimeInstance
from .session import open_probe_session
from .signature import read_signature

DEFAULT_MAX_BATCH_SIZE_OPTION = "default-max-batch-size"


class OnnxRuntimeBackend(Backend):
    """Serves ``model.onnx`` files with ONNX Runtime, one session per instance.

    Backend options (``--backend-config=onnxruntime,<key>=<value>``): ``default-max-batch-size`` (4), the
    max_batch_size auto-complete gives a model that can batch. The plugin imports onnxruntime only when a
    model loads, so a server without it still starts and reports why this backend is unavailable.
    """

    name = "onnxruntime"
    platforms = ("onnxruntime_onnx",)
    default_model_filename = "model.onnx"
    instance_kinds = ("CPU", "GPU")

    def auto_complete_config(self, model: ModelSpec) -> None:
        if not model.config.platform:
            model.config.platform = self.platforms[0]  # Triton reports ONNX models as "onnxruntime_onnx"
        if needs_completion(model.config):
            signature = read_signature(open_probe_session(model))
            auto_complete(model.config, signature, model.name, self.default_max_batch_size())

    def create_instance(self, model: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        return OnnxRuntimeInstance(model, instance)

    def unavailable_reason(self) -> str | None:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as error:
            return f"onnxruntime cannot be imported ({error}); pip install onnxruntime-gpu"
        return None

    def default_max_batch_size(self) -> int:
        value = self.options.get(DEFAULT_MAX_BATCH_SIZE_OPTION, str(DEFAULT_MAX_BATCH_SIZE))
        try:
            return int(value)
        except ValueError:
            raise ServerError(f"backend option onnxruntime,{DEFAULT_MAX_BATCH_SIZE_OPTION} must be an integer, "
                              f"got '{value}'") from None
