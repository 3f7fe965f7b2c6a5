"""The scheduler API and the helpers every scheduler uses to run a batch on an instance."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence

from .backend import ModelInstance, ModelSpec
from .errors import ServerError, internal
from .inference import InferenceRequest

log = logging.getLogger(__name__)


class Scheduler(ABC):
    """Decides when and on which instance each request of one model version runs.

    Registered per scheduling kind: "default" (no ``scheduling_choice`` in the config),
    "dynamic_batching", "sequence_batching" or "ensemble_scheduling". Runs on the event loop.
    """

    def __init__(self, model: ModelSpec, instances: Sequence[ModelInstance]) -> None:
        self.model = model
        self.instances = list(instances)

    @abstractmethod
    def enqueue(self, request: InferenceRequest) -> None:
        """Accept a validated request without blocking; its responses go through ``request.send``.
        Raise ServerError to reject it at once (for example a full queue)."""

    async def start(self) -> None:
        """Called after the instances are loaded, before the first request."""

    async def stop(self) -> None:
        """Stop accepting work and wait until every accepted request has been answered."""


class InstancePool:
    """Hands out idle instances: ``async with pool.acquire() as instance`` waits for one."""

    def __init__(self, instances: Sequence[ModelInstance]) -> None:
        self._idle: asyncio.Queue[ModelInstance] = asyncio.Queue()
        for instance in instances:
            self._idle.put_nowait(instance)

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[ModelInstance]:
        instance = await self._idle.get()
        try:
            yield instance
        finally:
            self._idle.put_nowait(instance)


async def execute_batch(instance: ModelInstance, requests: Sequence[InferenceRequest]) -> None:
    """Run ``requests`` on ``instance`` and make sure every request ends with a final response."""
    try:
        responses = await instance.execute(requests)
    except ServerError as error:
        responses, failure = None, error
    except Exception as error:  # a backend bug must fail its requests, not the server
        log.exception("model '%s' failed to execute", requests[0].model_name if requests else "?")
        responses, failure = None, internal(f"{type(error).__name__}: {error}")
    else:
        failure = None
        if responses is not None and len(responses) != len(requests):
            failure = internal(
                f"model '{requests[0].model_name}' returned {len(responses)} responses "
                f"for {len(requests)} requests")
            responses = None
    if responses is not None:
        for request, response in zip(requests, responses):
            if not request.finished:
                request.send(response)
        return
    for request in requests:
        if failure is not None:
            request.fail(failure)
        elif not request.finished:
            request.fail(internal(f"model '{request.model_name}' finished without a final response"))
