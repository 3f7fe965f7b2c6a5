"""The ``openvino`` backend: OpenVINO IR (``model.xml`` + ``model.bin``) or ONNX models compiled for the CPU."""
from __future__ import annotations

from triton_serve.plugin import AutoCompleteOptions, Backend, Model, ModelSpec

from .parameters import OpenVinoParameters


class OpenVinoBackend(Backend):
    """Serves ``backend: "openvino"`` models on the CPU, one compiled model and InferRequest per instance.

    Options: ``default-max-batch-size``; model parameters: ``OpenVinoParameters``.
    OpenVINO is imported only when a model uses the backend, so a server without it still starts and
    ``unavailable_reason`` says what to install.
    """

    name = "openvino"
    default_model_filename = "model.xml"
    Options = AutoCompleteOptions
    Parameters = OpenVinoParameters
    options: AutoCompleteOptions

    def auto_complete_config(self, model: ModelSpec) -> None:
        from .autocomplete import auto_complete_from_file

        auto_complete_from_file(model, self.options.default_max_batch_size)

    def create_model(self, spec: ModelSpec) -> Model:
        from .instance import OpenVinoModel

        return OpenVinoModel(self, spec)

    def unavailable_reason(self) -> str | None:
        try:
            import openvino  # noqa: F401
        except ImportError as error:
            return f"the openvino package cannot be imported ({error}); install it with 'pip install openvino'"
        return None
