"""Triton's dynamic batcher: combines queued requests into batches for idle instances.

A worker (two per instance) claims an instance that runs no batch of this batcher, then forms the next
batch by Triton's rule (``forming.plan_batch``): queue order is priority level, then arrival; a batch
that reaches a preferred size goes at once, as does the largest preferred (or fitting) prefix once the
queue holds more than the largest preferred size; a smaller batch waits up to
``max_queue_delay_microseconds`` for more requests. A waiting worker sleeps on one future, which
``enqueue`` resolves or a timer handle resolves at the delay's end.

As in Triton's ``DynamicBatchScheduler``, requests leave the queue only for an instance that can start
them: while an instance runs a batch, everything that arrives waits in the queue and goes in its next
batch together (Triton gathers it into the payload the instance takes next), and counts toward
``max_queue_size`` until then. An instance that could take more batches at once
(``ModelInstance.max_batches_in_flight``) still gets one at a time from this scheduler. The instance is
free again as soon as the model has answered (``_HandOver``): the other worker of the instance forms and
sends the next batch while the first hands out the responses.

Queue timeouts (``queues.PriorityQueue``) are applied when a batch is formed and, so that a request
waits no longer than its timeout while every instance is busy, by one timer armed for the earliest
deadline in the queue (only models whose queue policy sets a timeout ever arm it).

``TRITONSERVER_DELAY_SCHEDULER=N`` (read at load, a testing aid as in Triton) forms no batch
until N requests have been queued; after that the batcher behaves normally.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence

from triton_serve.plugin import (InferenceRequest, InferenceResponse, ModelContext, ModelInstance, Scheduler,
                                 ServerError, Status, request_batch_size)

from .delay import delay_scheduler_count
from .forming import BatchRule, plan_batch
from .queues import NO_DEADLINE, PriorityQueue, QueuedRequest


class DynamicBatcher(Scheduler):
    """The ``dynamic_batching`` scheduler."""

    def __init__(self, context: ModelContext) -> None:
        super().__init__(context)
        model = context.model
        config = model.config.dynamic_batching
        self.rule = BatchRule.of(model.config.max_batch_size, config.preferred_batch_size,
                                 config.max_queue_delay_microseconds)
        self.queue = PriorityQueue(model.name, config)
        self.ragged = {spec.name for spec in model.config.input if spec.allow_ragged_batch}
        self.delay_until_queued = delay_scheduler_count()
        self.ordering = _ResponseOrdering() if config.preserve_ordering else None
        self._wakeup: asyncio.Future[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None  # fires at _expiry_ns, the earliest queue deadline
        self._expiry_ns = NO_DEADLINE
        self._forming = asyncio.Lock()
        self._free: list[ModelInstance] = list(self.pool.instances)  # instances running no batch of ours
        self._holders: dict[int, object] = {}  # id(instance) -> the worker whose batch it runs
        self._handovers = {id(instance): _HandOver(instance, self._free_instance) for instance in self.pool.instances}
        self._released: asyncio.Future[None] | None = None  # resolved when an instance is freed
        self._workers: list[asyncio.Task[None]] = []
        self._executing = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False

    def enqueue(self, request: InferenceRequest) -> None:
        if self._stopping:
            raise ServerError(f"model '{self.model.name}' is unloading", Status.UNAVAILABLE)
        deadline = self.queue.push(request, request_batch_size(request, self.model.config))
        if deadline < self._expiry_ns:
            self._arm_expiry(deadline)
        if self.ordering is not None:
            self.ordering.add(request)
        self._idle.clear()
        self._wake()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # Two workers per instance: while one hands out the responses of the batch that just ran, the other
        # already forms the instance's next batch and sends it.
        self._workers = [loop.create_task(self._work()) for _ in range(2 * len(self.pool.instances))]

    async def stop(self) -> None:
        self._stopping = True
        self._wake()
        await self._idle.wait()
        if self._expiry is not None:
            self._expiry.cancel()
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)

    # ---- workers -------------------------------------------------------------------------------

    async def _work(self) -> None:
        """Claim an instance with no batch running, form a batch for it, run it."""
        worker = object()
        while True:
            instance = await self._claim(worker)
            try:
                async with self._forming:
                    batch = await self._next_batch()
                self._executing += 1
                try:
                    await self._execute(instance, batch)
                finally:
                    self._executing -= 1
                    self._check_idle()
            finally:
                self._free_instance(instance, worker)  # if the batch did not reach it (the hand-over frees it)

    async def _claim(self, worker: object) -> ModelInstance:
        """A free instance: a ready one while any instance is ready (a restarting one gets no work), else any,
        so that requests fail fast with the reason."""
        while True:
            instance = self._pick()
            if instance is not None:
                self._holders[id(instance)] = worker
                return instance
            if self._released is None:
                self._released = asyncio.get_running_loop().create_future()
            await self._released

    def _pick(self) -> ModelInstance | None:
        for instance in self._free:
            if instance.is_ready():
                self._free.remove(instance)
                return instance
        if self._free and not any(instance.is_ready() for instance in self.pool.instances):
            return self._free.pop(0)
        return None

    def _free_instance(self, instance: ModelInstance, worker: object | None = None) -> None:
        """Free ``instance`` (only if ``worker``, when given, still holds it) and wake the workers waiting."""
        holder = self._holders.get(id(instance))
        if holder is None or (worker is not None and holder is not worker):
            return
        del self._holders[id(instance)]
        self._free.append(instance)
        if self._released is not None:
            _resolve(self._released)
            self._released = None

    async def _execute(self, instance: ModelInstance, batch: list[InferenceRequest]) -> None:
        try:
            await self.pool.run(instance, batch, runner=self._handovers[id(instance)])
        finally:
            if self.ordering is not None:
                self.ordering.finished(batch)

    def _check_idle(self) -> None:
        if not self._executing and not len(self.queue):
            self._idle.set()

    # ---- forming a batch -------------------------------------------------------------------------

    async def _next_batch(self) -> list[InferenceRequest]:
        """Wait until Triton's rule sends a batch, and take it off the queue."""
        while True:
            now = time.monotonic_ns()
            self._drop_expired_and_cancelled(now)
            wait_until = NO_DEADLINE
            queued = len(self.queue)
            if queued and queued >= self.delay_until_queued:
                self.delay_until_queued = 0
                plan = plan_batch(self.queue.in_order(), self.rule, self._compatible, now, self._stopping)
                if plan.count:
                    return [entry.request for entry in self.queue.pop_front(plan.count)]
                wait_until = plan.wait_until_ns
            await self._sleep_until(min(wait_until, self.queue.next_deadline()))

    async def _sleep_until(self, deadline_ns: int) -> None:
        """Sleep until ``_wake`` is called or the monotonic clock reaches ``deadline_ns``: one
        future, plus one timer handle that is cancelled when the future is resolved first."""
        loop = asyncio.get_running_loop()
        wakeup: asyncio.Future[None] = loop.create_future()
        timer = None
        if deadline_ns < NO_DEADLINE:
            timer = loop.call_later(max(deadline_ns - time.monotonic_ns(), 0) / 1e9, _resolve, wakeup)
        self._wakeup = wakeup
        try:
            await wakeup
        finally:
            self._wakeup = None
            if timer is not None:
                timer.cancel()

    def _wake(self) -> None:
        """Wake the worker that is forming a batch, if it sleeps."""
        if self._wakeup is not None:
            _resolve(self._wakeup)

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

    def _arm_expiry(self, deadline_ns: int) -> None:
        """Apply the queue's timeouts at ``deadline_ns``, even while every instance is busy."""
        if self._expiry is not None:
            self._expiry.cancel()
        delay_s = max(deadline_ns - time.monotonic_ns(), 0) / 1e9
        self._expiry = asyncio.get_running_loop().call_later(delay_s, self._on_expiry)
        self._expiry_ns = deadline_ns

    def _on_expiry(self) -> None:
        self._expiry, self._expiry_ns = None, NO_DEADLINE
        self._drop_expired_and_cancelled(time.monotonic_ns())
        deadline = self.queue.next_deadline()
        if deadline < NO_DEADLINE:
            self._arm_expiry(deadline)
        self._wake()  # the worker forming a batch looks at the queue again

    def _answered(self, request: InferenceRequest) -> None:
        """A queued request was answered without running (queue timeout, cancelled): it is no longer pending."""
        self.context.stats.dequeued += 1
        if self.ordering is not None:
            self.ordering.finished([request])
        self._check_idle()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _HandOver(ModelInstance):
    """Runs a batch on its instance and frees the instance as soon as the model has answered, before the
    responses are handed out (the pool does that after ``execute`` returns): the worker waiting for the instance
    forms the next batch from what is queued now, as Triton's instance takes its next payload when ``execute``
    returns, and sends it without waiting for the responses to be written."""

    def __init__(self, instance: ModelInstance, free: Callable[[ModelInstance], None]) -> None:
        self._instance = instance
        self._free = free
        self.answers_later = instance.answers_later

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse] | None:
        try:
            return await self._instance.execute(requests)
        finally:
            self._free(self._instance)
            await asyncio.sleep(0)  # the worker waiting for the instance runs first

    def is_ready(self) -> bool:
        return self._instance.is_ready()


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

