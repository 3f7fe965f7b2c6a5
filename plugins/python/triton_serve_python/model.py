"""One version of a python-backend model: what its instances share, read from the config once."""
from __future__ import annotations

from triton_serve.plugin import Backend, InstanceSpec, Model, ModelInstance, ModelSpec, ServerError, Status

from .instance import PythonModelInstance
from .options import PythonModelParameters
from .stacking import stacks_requests


class PythonModel(Model):
    """Checks that ``model.py`` exists and reads the model's parameters (whether a batch is stacked into
    one request: stacking.py); each instance runs the model in a worker process of its own."""

    def __init__(self, backend: Backend, spec: ModelSpec) -> None:
        super().__init__(backend, spec)
        self.options: PythonModelParameters = spec.parameters
        self.stack = False

    async def load(self) -> None:
        spec = self.spec
        if not spec.model_file.is_file():
            raise ServerError(f"python model '{spec.name}' version {spec.version} has no model file "
                              f"'{spec.model_file.name}' in {spec.version_dir}", Status.NOT_FOUND)
        self.stack = stacks_requests(spec)

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return PythonModelInstance(self, instance)
