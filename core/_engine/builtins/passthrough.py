"""Built-in default scheduler: each request runs alone on the next idle instance."""
from __future__ import annotations

import asyncio
import logging
from collections import deque

from ..errors import ServerError, Status, unexpected
from ..hookspecs import hookimpl
from ..inference import InferenceRequest
from ..registry import SchedulerRegistry
from ..scheduling import ModelContext, Scheduler

log = logging.getLogger(__name__)


class PassThroughScheduler(Scheduler):
    """No batching, no queue policy: requests run alone, in arrival order, on the next idle instance.

    As many lanes as the pool runs batches at once each take the next queued request and run it, so a request
    costs a queue entry, not a task of its own."""

    def __init__(self, context: ModelContext) -> None:
        super().__init__(context)
        self._queue: deque[InferenceRequest] = deque()
        self._lanes: list[asyncio.Task[None]] = []
        self._idle_lanes: deque[asyncio.Future[None]] = deque()  # each resolved to give its lane a request
        self._stopping = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._lanes = [loop.create_task(self._lane()) for _ in range(max(self.pool.capacity, 1))]

    def enqueue(self, request: InferenceRequest) -> None:
        if self._stopping:
            raise ServerError(f"model '{self.model.name}' is unloading", Status.UNAVAILABLE)
        self._queue.append(request)
        self._wake_lanes(1)

    async def stop(self) -> None:
        self._stopping = True
        self._wake_lanes(len(self._idle_lanes))
        await asyncio.gather(*self._lanes, return_exceptions=True)

    def _wake_lanes(self, count: int) -> None:
        while count and self._idle_lanes:
            woken = self._idle_lanes.popleft()
            if not woken.done():  # done: its lane was cancelled
                woken.set_result(None)
                count -= 1

    async def _lane(self) -> None:
        """Run queued requests one after another; end once stopping with nothing queued."""
        queue, loop = self._queue, asyncio.get_running_loop()
        while True:
            if not queue:
                if self._stopping:
                    return
                woken: asyncio.Future[None] = loop.create_future()
                self._idle_lanes.append(woken)
                await woken
                continue
            request = queue.popleft()
            try:
                await self.pool.execute([request])
            except Exception as error:  # the pool answers every request it runs: this is a bug, not the model's
                log.exception("model '%s' could not run a request", self.model.name)
                request.fail(unexpected(error))


@hookimpl
def tserve_register_schedulers(registry: SchedulerRegistry) -> None:
    registry.add("default", PassThroughScheduler)
