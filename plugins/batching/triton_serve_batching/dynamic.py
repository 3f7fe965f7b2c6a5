"""Triton's dynamic batcher: combines queued requests into batches for idle instances.

One worker per instance waits for its instance, then forms the next batch: requests are taken
in queue order (priority level, then arrival) while their shapes are compatible and the sum of
their batch dimensions fits ``max_batch_size``. A batch goes out at once when it is full, when
it reaches a ``preferred_batch_size``, or when the oldest request has waited
``max_queue_delay_microseconds``; otherwise the worker waits for more requests.

``TRITONSERVER_DELAY_SCHEDULER=N`` (read at load, a testing aid as in Triton) forms no batch
until N requests have been queued; after that the batcher behaves normally.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence

from triton_serve.batch import request_batch_size
from triton_serve.plugin import InferenceRequest, InstancePool, ModelInstance, ModelSpec, Scheduler, ServerError, Status

from .delay import delay_scheduler_count
from .queues import NO_DEADLINE, PriorityQueue, QueuedRequest


class DynamicBatcher(Scheduler):
    """The ``dynamic_batching`` scheduler."""

    def __init__(self, model: ModelSpec, pool: InstancePool) -> None:
        super().__init__(model, pool)
        config = model.config.dynamic_batching
        self.max_batch_size = max(model.config.max_batch_size, 1)
        self.preferred = sorted(set(config.preferred_batch_size))
        self.max_delay_ns = config.max_queue_delay_microseconds * 1000
        self.queue = PriorityQueue(model.name, config)
        self.ragged = {spec.name for spec in model.config.input if spec.allow_ragged_batch}
        self.delay_until_queued = delay_scheduler_count()
        self.ordering = _ResponseOrdering() if config.preserve_ordering else None
        self._arrived = asyncio.Event()
        self._forming = asyncio.Lock()
        self._workers: list[asyncio.Task[None]] = []
        self._executing = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False

    def enqueue(self, request: InferenceRequest) -> None:
        if self._stopping:
            raise ServerError(f"model '{self.model.name}' is unloading", Status.UNAVAILABLE)
        self.queue.push(request, request_batch_size(request, self.model.config))
        if self.ordering is not None:
            self.ordering.add(request)
        self._idle.clear()
        self._arrived.set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._workers = [loop.create_task(self._work()) for _ in self.pool.instances]

    async def stop(self) -> None:
        self._stopping = True
        self._arrived.set()
        await self._idle.wait()
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)

    # ---- workers -------------------------------------------------------------------------------

    async def _work(self) -> None:
        """One per instance: wait for an idle instance, form a batch for it, run it."""
        while True:
            async with self.pool.acquire() as instance:
                async with self._forming:
                    batch = await self._next_batch()
                self._executing += 1
                try:
                    await self._execute(instance, batch)
                finally:
                    self._executing -= 1
                    self._check_idle()

    async def _execute(self, instance: ModelInstance, batch: list[InferenceRequest]) -> None:
        try:
            await self.pool.run(instance, batch)
        finally:
            if self.ordering is not None:
                self.ordering.finished(batch)

    def _check_idle(self) -> None:
        if not self._executing and not len(self.queue):
            self._idle.set()

    # ---- forming a batch -------------------------------------------------------------------------

    async def _next_batch(self) -> list[InferenceRequest]:
        while True:
            now = time.monotonic_ns()
            self._drop_expired_and_cancelled(now)
            wait_until = NO_DEADLINE
            if len(self.queue) and len(self.queue) >= self.delay_until_queued:
                self.delay_until_queued = 0
                taken, wait_until = self._plan(now)
                if taken:
                    self.queue.remove(taken)
                    return [entry.request for entry in taken]
            wait_until = min(wait_until, self.queue.next_deadline())
            self._arrived.clear()
            timeout = None if wait_until >= NO_DEADLINE else max(wait_until - now, 0) / 1e9
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout)

    def _plan(self, now: int) -> tuple[list[QueuedRequest], int]:
        """The requests to send now, or none and when to look again."""
        taken: list[QueuedRequest] = []
        best_preferred = 0
        total = 0
        send_now = False
        for entry in self.queue.in_order():
            if total + entry.size > self.max_batch_size or (taken and not self._compatible(taken[0], entry)):
                send_now = True
                break
            taken.append(entry)
            total += entry.size
            if total in self.preferred:
                best_preferred = len(taken)
            if total == self.max_batch_size:
                send_now = True
                break
        if not taken:
            return [], NO_DEADLINE
        if total == self.max_batch_size:
            return taken, 0
        if best_preferred:
            return taken[:best_preferred], 0
        oldest = min(entry.request.enqueued_ns for entry in taken)
        if send_now or now - oldest >= self.max_delay_ns or self._stopping:
            return taken, 0
        return [], oldest + self.max_delay_ns

    def _compatible(self, first: QueuedRequest, other: QueuedRequest) -> bool:
        """Whether two requests can share a batch: the same inputs, with the same shapes past the
        batch dimension (any shapes for inputs that allow ragged batching)."""
        a, b = first.request.inputs, other.request.inputs
        if a.keys() != b.keys():
            return False
        return all(name in self.ragged or a[name].shape[1:] == b[name].shape[1:] for name in a)

    def _drop_expired_and_cancelled(self, now: int) -> None:
        def reject(entry: QueuedRequest) -> None:
            entry.request.fail(ServerError("Request timeout expired", Status.UNAVAILABLE))
            self._answered(entry.request)

        self.queue.expire(now, reject)
        for entry in self.queue.drop_cancelled():
            entry.request.fail(ServerError(f"request to model '{self.model.name}' was cancelled", Status.CANCELLED))
            self._answered(entry.request)

    def _answered(self, request: InferenceRequest) -> None:
        if self.ordering is not None:
            self.ordering.finished([request])
        self._check_idle()


class _ResponseOrdering:
    """``preserve_ordering``: each request's responses reach its client only after every request
    that arrived before it has been answered."""

    def __init__(self) -> None:
        self._open: deque[tuple[InferenceRequest, asyncio.Future[None]]] = deque()
        self._answered: set[int] = set()

    def add(self, request: InferenceRequest) -> None:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        request.response_gate = gate
        self._open.append((request, gate))
        self._release()

    def finished(self, requests: Sequence[InferenceRequest]) -> None:
        self._answered.update(id(request) for request in requests)
        self._release()

    def _release(self) -> None:
        """Open the gate of the oldest unanswered request, forgetting answered ones before it."""
        while self._open:
            request, gate = self._open[0]
            if not gate.done():
                gate.set_result(None)
            if id(request) not in self._answered:
                return
            self._answered.discard(id(request))
            self._open.popleft()

