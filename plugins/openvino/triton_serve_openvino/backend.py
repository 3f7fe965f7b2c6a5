"""The ``openvino`` backend: OpenVINO IR (``model.xml`` + ``model.bin``) or ONNX models compiled for the CPU."""
from __future__ import annotations

from collections.abc import Mapping

from triton_serve.plugin import Backend, InstanceSpec, ModelInstance, ModelSpec, ServerError

from .parameters import OpenVinoParameters, default_max_batch_size


class OpenVinoBackend(Backend):
    """Serves ``backend: "openvino"`` models on the CPU, one compiled model and InferRequest per instance.

    Options: ``--backend-config=openvino,default-max-batch-size=N`` (the max_batch_size auto-complete
    gives a model that batches; 4 by default). Per-model parameters: see parameters.py.
    OpenVINO is imported only when a model uses the backend, so a server without it still starts and
    ``unavailable_reason`` says what to install.
    """

    name = "openvino"
    default_model_filename = "model.xml"

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self.default_max_batch_size = default_max_batch_size(self.options)

    def auto_complete_config(self, model: ModelSpec) -> None:
        from .autocomplete import auto_complete_from_file

        auto_complete_from_file(model, self.default_max_batch_size)

    def create_instance(self, model: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        from .instance import OpenVinoInstance

        if instance.kind != "CPU":
            raise ServerError(f"model '{model.name}': instance group '{instance.group.name}' has kind "
                              f"KIND_{instance.kind}, but the openvino backend runs models on the CPU only; "
                              "use kind: KIND_CPU")
        return OpenVinoInstance(model, instance, OpenVinoParameters.from_config(model.config, model.name))

    def unavailable_reason(self) -> str | None:
        try:
            import openvino  # noqa: F401
        except ImportError as error:
            return f"the openvino package cannot be imported ({error}); install it with 'pip install openvino'"
        return None
