"""A python-backend model instance: one worker process, restarted when it dies, with readiness to match."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from triton_serve.plugin import (InferenceRequest, InferenceResponse, InstanceSpec, ModelInstance, ServerError, Status,
                                 config_to_json, content_type_names)

from .process import WorkerFailure, WorkerProcess, WorkerStartFailed
from .stacking import stack_requests, unstack_response

if TYPE_CHECKING:
    from .model import PythonModel

log = logging.getLogger("triton_serve_python")
START_ATTEMPTS = 3  # worker processes tried before a load fails for a worker that dies before it starts
READINESS_TIMEOUT_S = 5.0  # as Triton: an is_ready() that takes longer reads "not ready" for that check


class PythonModelInstance(ModelInstance):
    """Runs ``model.py`` in its own worker process, so a crash, hang or exit there cannot reach the server.

    While the worker is dead or restarting the instance is not ready (so neither is the model nor, with
    strict readiness, the server) and requests fail at once with UNAVAILABLE. With ``model.stack``, a batch
    reaches ``execute`` as one request whose inputs are stacked along the batch dimension (stacking.py).
    Requests the model answers through response senders stay open after ``execute`` returns
    (``answers_later``) until their final response, the worker's death or the unload.
    """

    answers_later = True
    # The worker runs batches in order; the next ones wait in its socket, so a busy worker reads them without
    # sleeping and the server's writes do not wake it (about 20% more requests per second than with 2, on add_sub).
    max_batches_in_flight = 8
    model: PythonModel

    def __init__(self, model: PythonModel, spec: InstanceSpec) -> None:
        super().__init__(model, spec)
        self.options = model.options
        self.label = f"instance '{spec.name}' of python model '{model.spec.name}'"
        self._worker: WorkerProcess | None = None
        self._not_running = "is not loaded"
        self._restart_task: asyncio.Task[None] | None = None
        self._unloading = False

    def _init_message(self) -> dict[str, Any]:
        spec = self.model.spec
        return {
            "model_file": str(spec.model_file),
            "decoupled": spec.config.model_transaction_policy.decoupled,
            "outputs": [output.name for output in spec.config.output],
            "content_types": content_type_names(),  # what the request tuples' content decodes into
            "args": {  # exactly the seven keys Triton gives ``initialize``
                "model_config": json.dumps(config_to_json(spec.config)),
                "model_instance_kind": self.spec.kind,
                "model_instance_name": self.spec.name,
                "model_instance_device_id": str(self.spec.device_id),
                "model_repository": str(spec.model_dir),
                "model_version": str(spec.version),
                "model_name": spec.name,
            },
        }

    async def _start_worker(self) -> WorkerProcess:
        """A started worker with the model initialized; a worker that dies before it starts is replaced."""
        for attempt in range(1, START_ATTEMPTS):
            try:
                return await self._launch_worker()
            except WorkerStartFailed as failure:
                log.warning("%s; starting another (attempt %d of %d)", failure.message, attempt + 1, START_ATTEMPTS)
        return await self._launch_worker()

    async def _launch_worker(self) -> WorkerProcess:
        worker = WorkerProcess(self.label, self.options, self._on_worker_exit, self.model.spec.client)
        await worker.start(self._init_message())
        return worker

    # ---- ModelInstance --------------------------------------------------------------------------

    async def load(self) -> None:
        self._worker = await self._start_worker()

    def is_ready(self) -> bool:
        return self._worker is not None and self._worker.running

    async def check_ready(self) -> bool:
        """The model's own ``is_ready()``, where it defines one (Triton 26.03's user-defined readiness check)."""
        worker = self._worker
        if worker is None or not worker.running:
            return False
        ready, error = await worker.user_ready(READINESS_TIMEOUT_S)
        if not ready:
            log.debug("Model '%s' is not ready: %s", self.model.spec.name,
                      error or "user-defined check failed")
        return ready

    def not_ready_reason(self) -> str:
        return f"python backend worker for {self.label} {self._not_running}"

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse] | None:
        worker = self._worker
        if worker is None or not worker.running:
            raise ServerError(f"python backend worker for {self.label} {self._not_running}", Status.UNAVAILABLE)
        try:
            if self.model.stack:
                config = self.model.spec.config
                stacked = await worker.execute([stack_requests(requests, config)])
                return unstack_response(stacked[0], requests, config)
            responses = await worker.execute(requests)
        except WorkerFailure as failure:
            next_step = "it is being restarted" if self.options.restart_on_failure else "it will not be restarted"
            raise ServerError(f"python backend worker for {self.label} {failure} while executing the "
                              f"request; {next_step}", Status.INTERNAL) from None
        if all(response is not None for response in responses):
            return responses  # type: ignore[return-value]
        for request, response in zip(requests, responses):  # some answer through their response senders
            if response is not None:
                request.send(response)
        return None

    async def unload(self) -> None:
        self._unloading = True
        if self._restart_task is not None:
            self._restart_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._restart_task
        if self._worker is not None:
            await self._worker.stop()

    # ---- failures and restarts ------------------------------------------------------------------

    def _on_worker_exit(self, description: str) -> None:
        log.error("python backend worker for %s %s", self.label, description)
        if self._unloading:
            return
        if not self.options.restart_on_failure:
            self._not_running = f"{description}; restart-on-failure is off, so the model stays not ready " \
                                "until it is reloaded"
            log.error("python backend worker for %s will not be restarted (restart-on-failure is off)", self.label)
            return
        self._not_running = f"{description} and is restarting"
        self._restart_task = asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        log.warning("restarting the python backend worker for %s", self.label)
        try:
            self._worker = await self._start_worker()
        except Exception as error:
            reason = error.message if isinstance(error, ServerError) else f"{type(error).__name__}: {error}"
            self._not_running = f"could not be restarted ({reason}); the model stays not ready until it is reloaded"
            log.error("python backend worker for %s %s", self.label, self._not_running)
            return
        log.info("restarted the python backend worker for %s", self.label)
