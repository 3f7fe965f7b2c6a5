"""The ``python`` backend: Triton Python-backend models (``<version>/model.py``) in worker processes."""
from __future__ import annotations

from triton_serve.plugin import Backend, Model, ModelSpec

from .autocomplete import auto_complete
from .model import PythonModel
from .options import PythonBackendOptions, PythonModelParameters


class PythonBackend(Backend):
    """Serves ``backend: "python"`` models; each instance runs in its own worker process.
    Options: ``PythonBackendOptions`` (``--backend-config=python,<key>=<value>``, or a model parameter of the
    same key); model parameters: ``PythonModelParameters``."""

    name = "python"
    default_model_filename = "model.py"
    Options = PythonBackendOptions
    Parameters = PythonModelParameters

    def auto_complete_config(self, model: ModelSpec) -> None:
        auto_complete(model, model.parameters.stub_timeout_seconds)

    def create_model(self, spec: ModelSpec) -> Model:
        return PythonModel(self, spec)
