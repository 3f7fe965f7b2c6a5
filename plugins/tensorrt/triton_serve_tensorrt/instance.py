"""A TensorRT model instance: one execution context and CUDA stream on its GPU."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from triton_serve.plugin import (InferenceRequest, InferenceResponse, InstanceSpec, ModelInstance, ModelSpec,
                                 ServerError, Status, concat_inputs, split_outputs)

from .plan_files import plan_path
from .profiles import profile_indices
from .shared_engines import EngineLease, SharedEngines
from .validation import check_config_against_engine

if TYPE_CHECKING:
    from .engine import ExecutionSession, LoadedEngine


class TensorRTInstance(ModelInstance):
    """Runs batches on GPU ``instance.device_id`` with the profiles its instance group allows.

    ``load`` takes a lease on the engine that all instances of the model version on that GPU share,
    checks the config against it and creates this instance's execution context and stream;
    ``execute`` concatenates the batch and runs it in a worker thread; ``unload`` frees it all.
    """

    def __init__(self, model: ModelSpec, instance: InstanceSpec, engines: SharedEngines[LoadedEngine]) -> None:
        self.model = model
        self.instance = instance
        self._engines = engines
        self._lease: EngineLease[LoadedEngine] | None = None
        self._session: ExecutionSession | None = None

    async def load(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        from .engine import ExecutionSession, describe_engine

        device = self.instance.device_id
        plan = plan_path(self.model, device)
        try:
            self._lease = self._engines.acquire(plan, device)
        except ServerError as error:  # load_engine's errors do not know the model
            raise ServerError(f"model '{self.model.name}' version {self.model.version}: {error.message}",
                              error.status) from None
        try:
            description = describe_engine(self._lease.engine.engine)
            profiles = profile_indices(self.instance.group, description.num_profiles, self.model.name)
            check_config_against_engine(self.model.name, self.model.config, description, profiles)
            returned = [output.name for output in self.model.config.output]
            self._session = ExecutionSession(self.model.name, self._lease.engine, description, device, profiles,
                                             returned)
        except BaseException:
            self._lease.release()
            self._lease = None
            raise

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse]:
        session = self._session
        if session is None:
            raise ServerError(f"model '{self.model.name}' instance '{self.instance.name}' is not loaded",
                              Status.UNAVAILABLE)
        arrays = concat_inputs(requests, self.model.config)
        outputs: dict[str, Any] = await asyncio.to_thread(session.run, arrays)
        return split_outputs(outputs, requests, self.model.config)

    async def unload(self) -> None:
        await asyncio.to_thread(self._unload)

    def _unload(self) -> None:
        session, self._session = self._session, None
        lease, self._lease = self._lease, None
        try:
            if session is not None:
                session.close()
        finally:
            if lease is not None:
                lease.release()
