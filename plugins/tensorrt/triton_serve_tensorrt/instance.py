"""A TensorRT model version and its instances: engines shared per GPU, one execution context and CUDA
stream per instance, created, run and freed on the instance's thread."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from triton_serve.plugin import Backend, FrameworkInstance, InstanceSpec, Model, ModelInstance, ModelSpec, ServerError

from .plan_files import plan_path
from .profiles import profile_indices
from .shared_engines import EngineLease, SharedEngines
from .validation import check_config_against_engine

if TYPE_CHECKING:
    from .engine import ExecutionSession, LoadedEngine


class TensorRTModel(Model):
    """One version of a TensorRT model. ``engines`` holds the engine of each (plan file, GPU) that its
    instances share: loaded by the first instance on that GPU, freed after the last (as Triton's
    TensorRT backend shares engines between the instances of a model). Instances are KIND_GPU only."""

    def __init__(self, backend: Backend, spec: ModelSpec) -> None:
        super().__init__(backend, spec)
        self.engines: SharedEngines[LoadedEngine] = SharedEngines(_load_engine)

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        if instance.kind != "GPU":
            raise ServerError(f"model '{self.spec.name}': instance group '{instance.group.name}' is "
                              f"KIND_{instance.kind}, but TensorRT engines run only on GPUs; use kind: KIND_GPU")
        return TensorRTInstance(self, instance)


class TensorRTInstance(FrameworkInstance):
    """Runs batches on GPU ``spec.device_id`` with the profiles its instance group allows: ``open`` takes
    a lease on the model's engine for that GPU, checks the config against it and creates the execution
    context and stream; ``close`` frees them and returns the lease."""

    model: TensorRTModel
    _lease: EngineLease[LoadedEngine]
    _session: ExecutionSession

    def open(self) -> None:
        from .engine import ExecutionSession, describe_engine

        spec, device = self.model.spec, self.spec.device_id
        plan = plan_path(spec, device)
        try:
            lease = self.model.engines.acquire(plan, device)
        except ServerError as error:  # load_engine's errors do not know the model
            raise ServerError(f"model '{spec.name}' version {spec.version}: {error.message}", error.status) from None
        try:
            description = describe_engine(lease.engine.engine)
            profiles = profile_indices(self.spec.group, description.num_profiles, spec.name)
            check_config_against_engine(spec.name, spec.config, description, profiles)
            returned = [output.name for output in spec.config.output]
            self._session = ExecutionSession(spec.name, lease.engine, description, device, profiles, returned)
        except BaseException:
            lease.release()
            raise
        self._lease = lease

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._session.run(inputs)

    def close(self) -> None:
        try:
            self._session.close()
        finally:
            self._lease.release()


def _load_engine(plan: Path, device: int) -> LoadedEngine:
    """``engine.load_engine``, imported only when an engine loads (it imports TensorRT)."""
    from .engine import load_engine

    return load_engine(plan, device)
