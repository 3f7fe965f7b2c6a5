"""Built-in default scheduler: each request runs alone on the next idle instance."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ..backend import ModelInstance, ModelSpec
from ..hookspecs import hookimpl
from ..inference import InferenceRequest
from ..registry import SchedulerRegistry
from ..scheduling import InstancePool, Scheduler, execute_batch


class PassThroughScheduler(Scheduler):
    """No batching, no queue policy: requests wait for an idle instance in arrival order."""

    def __init__(self, model: ModelSpec, instances: Sequence[ModelInstance]) -> None:
        super().__init__(model, instances)
        self._pool = InstancePool(instances)
        self._tasks: set[asyncio.Task[None]] = set()

    def enqueue(self, request: InferenceRequest) -> None:
        task = asyncio.get_running_loop().create_task(self._run(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, request: InferenceRequest) -> None:
        async with self._pool.acquire() as instance:
            await execute_batch(instance, [request])

    async def stop(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


@hookimpl
def tserve_register_schedulers(registry: SchedulerRegistry) -> None:
    registry.add("default", PassThroughScheduler)
