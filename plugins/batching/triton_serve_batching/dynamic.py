"""Triton's dynamic batcher: combines queued requests into batches for idle instances.

Whenever a request arrives or an instance becomes free, the batcher forms batches by Triton's rule
(``forming.plan_batch``) for the free instances: queue order is priority level, then arrival; a batch that
reaches a preferred size goes at once, as does the largest preferred (or fitting) prefix once the queue holds
more than the largest preferred size; a smaller batch waits up to ``max_queue_delay_microseconds`` for more
requests (a timer forms it then). Each batch runs as a task of its own. Forming after an arrival waits for the
end of the event loop's turn, so requests read together batch together.

As in Triton's ``DynamicBatchScheduler``, requests leave the queue only for an instance that can start
them: while an instance runs a batch, everything that arrives waits in the queue and goes in its next
batch together (Triton gathers it into the payload the instance takes next), and counts toward
``max_queue_size`` until then. An instance that could take more batches at once
(``ModelInstance.max_batches_in_flight``) still gets one at a time from this scheduler. The instance is
free again as soon as the model has answered (``_HandOver``): its next batch is formed and sent before the
responses of the last one are handed out.

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
        self._loop: asyncio.AbstractEventLoop | None = None  # the event loop it runs on, once it has seen it
        self._forming: asyncio.Handle | None = None  # forms batches at the end of this loop turn
        self._delay: asyncio.TimerHandle | None = None  # forms the batch that waits at _delay_ns
        self._delay_ns = NO_DEADLINE
        self._expiry: asyncio.TimerHandle | None = None  # fires at _expiry_ns, the earliest queue deadline
        self._expiry_ns = NO_DEADLINE
        self._free: list[ModelInstance] = list(self.pool.instances)  # instances running no batch of ours
        self._holders: dict[int, list[InferenceRequest]] = {}  # id(instance) -> the batch it runs
        self._handovers = {id(instance): _HandOver(instance, self._hand_over) for instance in self.pool.instances}
        self._batches: set[asyncio.Task[None]] = set()
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
        if self._forming is None and self._free:
            self._forming = self._running_loop().call_soon(self._form_after_arrivals)

    async def stop(self) -> None:
        self._stopping = True
        self._form()  # what is queued goes without waiting for the delay
        await self._idle.wait()
        for handle in (self._forming, self._delay, self._expiry):
            if handle is not None:
                handle.cancel()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop, asked once (each ``asyncio.get_running_loop()`` costs a ``getpid()`` call)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _call_at(self, deadline_ns: int, callback: Callable[[], None]) -> asyncio.TimerHandle:
        """Call ``callback`` when the monotonic clock reaches ``deadline_ns``."""
        return self._running_loop().call_later(max(deadline_ns - time.monotonic_ns(), 0) / 1e9, callback)

    # ---- forming and running batches ----------------------------------------------------------

    def _form(self) -> bool:
        """Send the batches Triton's rule sends now to free instances; arm the delay's timer for one that
        waits. Whether a batch was sent."""
        sent = False
        while len(self.queue):
            instance = self._pickable()
            if instance is None:
                return sent
            now = time.monotonic_ns()
            self._drop_expired_and_cancelled(now)
            queued = len(self.queue)
            if not queued or queued < self.delay_until_queued:
                return sent
            self.delay_until_queued = 0
            plan = plan_batch(self.queue.in_order(), self.rule, self._compatible, now, self._stopping)
            if not plan.count:
                self._form_at(plan.wait_until_ns)
                return sent
            self._free.remove(instance)
            self._start([entry.request for entry in self.queue.pop_front(plan.count)], instance)
            sent = True
        return sent

    def _form_after_arrivals(self) -> None:
        self._forming = None
        self._form()

    def _pickable(self) -> ModelInstance | None:
        """The free instance for the next batch: a ready one while any instance is ready (a restarting one gets
        no work), else any, so that requests fail fast with the reason."""
        for instance in self._free:
            if instance.is_ready():
                return instance
        if self._free and not any(instance.is_ready() for instance in self.pool.instances):
            return self._free[0]
        return None

    def _start(self, batch: list[InferenceRequest], instance: ModelInstance) -> None:
        self._holders[id(instance)] = batch
        self._executing += 1
        task = self._running_loop().create_task(self._run(batch, instance))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    async def _run(self, batch: list[InferenceRequest], instance: ModelInstance) -> None:
        try:
            await self.pool.run(instance, batch, runner=self._handovers[id(instance)])
        finally:
            if self.ordering is not None:
                self.ordering.finished(batch)
            self._executing -= 1
            if self._holders.get(id(instance)) is batch:  # the batch did not reach the model: free it here
                self._hand_over(instance)
            self._check_idle()

    def _hand_over(self, instance: ModelInstance) -> bool:
        """The model has answered on ``instance``: free it and send its next batch. Whether one was sent."""
        del self._holders[id(instance)]
        self._free.append(instance)
        return self._form()

    def _form_at(self, deadline_ns: int) -> None:
        """Form batches again at ``deadline_ns`` (the end of the oldest request's delay), if no earlier timer will."""
        if deadline_ns >= self._delay_ns or deadline_ns == NO_DEADLINE:
            return
        if self._delay is not None:
            self._delay.cancel()
        self._delay = self._call_at(deadline_ns, self._on_delay)
        self._delay_ns = deadline_ns

    def _on_delay(self) -> None:
        self._delay, self._delay_ns = None, NO_DEADLINE
        self._form()

    def _check_idle(self) -> None:
        if not self._executing and not len(self.queue):
            self._idle.set()

    def _compatible(self, first: QueuedRequest, other: QueuedRequest) -> bool:
        """Whether two requests can share a batch: the same inputs, with the same shapes past the
        batch dimension (any shapes for inputs that allow ragged batching)."""
        a, b = first.request.inputs, other.request.inputs
        if a.keys() != b.keys():
            return False
        return all(name in self.ragged or a[name].shape[1:] == b[name].shape[1:] for name in a)

    # ---- queue timeouts and cancellations ------------------------------------------------------

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
        self._expiry = self._call_at(deadline_ns, self._on_expiry)
        self._expiry_ns = deadline_ns

    def _on_expiry(self) -> None:
        self._expiry, self._expiry_ns = None, NO_DEADLINE
        self._drop_expired_and_cancelled(time.monotonic_ns())
        deadline = self.queue.next_deadline()
        if deadline < NO_DEADLINE:
            self._arm_expiry(deadline)
        self._form()  # a request that timed out may have held back a batch

    def _answered(self, request: InferenceRequest) -> None:
        """A queued request was answered without running (queue timeout, cancelled): it is no longer pending."""
        self.context.stats.dequeued += 1
        if self.ordering is not None:
            self.ordering.finished([request])
        self._check_idle()


class _HandOver(ModelInstance):
    """Runs a batch on its instance and frees the instance as soon as the model has answered, before the
    responses are handed out (the pool does that after ``execute`` returns): the instance's next batch is formed
    from what is queued now, as Triton's instance takes its next payload when ``execute`` returns, and sent
    before the responses are written."""

    def __init__(self, instance: ModelInstance, hand_over: Callable[[ModelInstance], bool]) -> None:
        self._instance = instance
        self._hand_over = hand_over
        self.answers_later = instance.answers_later

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse] | None:
        try:
            return await self._instance.execute(requests)
        finally:
            if self._hand_over(self._instance):
                await asyncio.sleep(0)  # the next batch's task sends it first

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

