"""Built-in default scheduler: each request runs alone on the next idle instance."""
from __future__ import annotations

import asyncio

from ..hookspecs import hookimpl
from ..inference import InferenceRequest
from ..registry import SchedulerRegistry
from ..scheduling import ModelContext, Scheduler


class PassThroughScheduler(Scheduler):
    """No batching, no queue policy: requests wait for an idle instance in arrival order."""

    def __init__(self, context: ModelContext) -> None:
        super().__init__(context)
        self._tasks: set[asyncio.Task[None]] = set()

    def enqueue(self, request: InferenceRequest) -> None:
        task = asyncio.get_running_loop().create_task(self.pool.execute([request]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


@hookimpl
def tserve_register_schedulers(registry: SchedulerRegistry) -> None:
    registry.add("default", PassThroughScheduler)
