"""The ``python`` backend: Triton Python-backend models (``<version>/model.py``) in worker processes."""
from __future__ import annotations

from collections.abc import Mapping

from triton_serve.plugin import Backend, InstanceSpec, ModelInstance, ModelSpec, ServerError, Status

from .autocomplete import auto_complete
from .instance import PythonModelInstance
from .options import PythonBackendOptions
from .stacking import stacks_requests


class PythonBackend(Backend):
    """Serves ``backend: "python"`` models; each instance runs in its own worker process.
    Options (``--backend-config=python,<key>=<value>``, or a model parameter of the same key): see options.py;
    the model parameter ``stack_requests``: see stacking.py."""

    name = "python"
    default_model_filename = "model.py"

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self.settings = PythonBackendOptions.parse(self.options)

    def auto_complete_config(self, model: ModelSpec) -> None:
        auto_complete(model, self.settings.for_model(model.config).stub_timeout_seconds)

    def create_instance(self, model: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        if not model.model_file.is_file():
            raise ServerError(f"python model '{model.name}' version {model.version} has no model file "
                              f"'{model.model_file.name}' in {model.version_dir}", Status.NOT_FOUND)
        return PythonModelInstance(model, instance, self.settings.for_model(model.config),
                                   stack=stacks_requests(model.config))
