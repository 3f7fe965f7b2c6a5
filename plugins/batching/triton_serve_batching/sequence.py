"""Triton's sequence batcher: each sequence's requests run in order on one instance, with control
inputs, implicit state and idle-sequence expiry."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from triton_serve.plugin import (InferenceRequest, ModelContext, ModelInstance, Scheduler, ServerError, Status,
                                 request_batch_size)

from .controls import SequenceControls
from .correlation import CorrelationId, check_correlation_id
from .delay import delay_scheduler_count
from .idle_sequences import DEFAULT_MAX_SEQUENCE_IDLE_US, IdleSequenceTimer
from .implicit_state import ImplicitStates, StatefulExecution
from .slots import ActiveSequence, Slot, SlotTable
from .strategies import DirectStrategy, OldestStrategy, Strategy

log = logging.getLogger(__name__)


class SequenceBatcher(Scheduler):
    """Triton's sequence batcher (``sequence_batching`` in the config).

    A request's correlation id names its sequence; START gives the sequence a batch slot of one
    instance (or a place in the backlog while every slot is taken), END or
    ``max_sequence_idle_microseconds`` of silence frees it. Each instance has ``max_batch_size``
    slots (``oldest.max_candidate_sequences`` with the oldest strategy) and runs one batch at a
    time, at most one request per sequence, so a sequence's requests execute in order on the same
    instance. Control inputs and implicit state are added to each request as it joins a batch.
    ``TRITONSERVER_DELAY_SCHEDULER=N`` holds every batch until N requests have been accepted.
    """

    def __init__(self, context: ModelContext) -> None:
        super().__init__(context)
        model = context.model
        config = model.config
        settings = config.sequence_batching
        if settings.iterative_sequence:
            raise ServerError(f"model '{model.name}': sequence_batching.iterative_sequence is not supported",
                              Status.UNSUPPORTED)
        self._controls = SequenceControls(config)
        self._states = ImplicitStates(model)
        if self._states and config.model_transaction_policy.decoupled:
            raise ServerError(f"model '{model.name}': implicit state (sequence_batching.state) is not supported "
                              "for decoupled models", Status.UNSUPPORTED)
        max_batch = max(1, config.max_batch_size)
        slot_count = max_batch
        if settings.HasField("oldest"):
            self._strategy: Strategy = OldestStrategy(settings.oldest, max_batch)
            slot_count = settings.oldest.max_candidate_sequences or max_batch
        else:
            self._strategy = DirectStrategy(settings.direct, max_batch)
        self._batchers = [_InstanceBatcher(self, instance, number, slot_count)
                          for number, instance in enumerate(self.pool.instances)]
        self._slots = SlotTable(slot for batcher in self._batchers for slot in batcher.slots)
        self._routes: dict[CorrelationId, ActiveSequence] = {}  # sequences that still accept requests
        idle_us = settings.max_sequence_idle_microseconds or DEFAULT_MAX_SEQUENCE_IDLE_US
        self._idle = IdleSequenceTimer(idle_us * 1000, self._expire)
        self._delay_count = delay_scheduler_count()
        self._accepted = 0
        self._queued = 0  # accepted requests that have not finished executing
        self._drained = asyncio.Event()
        self._drained.set()
        self._stopping = False
        self._stopped = False
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(batcher.run()) for batcher in self._batchers]
        self._tasks.append(loop.create_task(self._idle.run()))

    async def stop(self) -> None:
        self._stopping = True
        while self._queued:
            await self._drained.wait()
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def enqueue(self, request: InferenceRequest) -> None:
        model, corrid = request.model_name, request.sequence_id
        if request_batch_size(request, self.model.config) > 1:
            raise ServerError(f"inference request to model '{model}' must specify batch-size 1 due to requirements "
                              "of sequence batcher")
        check_correlation_id(request, self._controls.corrid_input)
        if self._stopped or (self._stopping and request.sequence_start):
            raise ServerError("Server is stopping, scheduler for model has stopped accepting new inference requests",
                              Status.UNAVAILABLE)
        sequence = self._routes.get(corrid)
        if sequence is None and not request.sequence_start:
            raise ServerError(f"inference request for sequence {corrid} to model '{model}' must specify the START "
                              "flag on the first request of the sequence")
        if sequence is None:
            sequence = self._routes[corrid] = ActiveSequence(corrid)
            self._slots.place(sequence)
        elif request.sequence_start:
            log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                        "sequence start. Previous sequence will be terminated early.", corrid, model)
        sequence.requests.append(request)
        if request.sequence_end:
            sequence.ended = True
            del self._routes[corrid]
        self._idle.seen(corrid)
        self._accepted += 1
        self._queued += 1
        self._drained.clear()
        if self._delay_count and self._accepted >= self._delay_count:
            self._delay_count = 0
            for batcher in self._batchers:
                batcher.wake()
        elif sequence.slot is not None:
            sequence.slot.wake()

    def _expire(self, corrid: CorrelationId) -> bool:
        """Release sequence ``corrid``, idle too long; False while it waits in the backlog."""
        sequence = self._routes.get(corrid)
        if sequence is None:
            return True  # it ended already
        if sequence.slot is None:
            return False
        log.info("sequence %s of model '%s' was idle for more than %d us; releasing it",
                 corrid, self.model.name, self._idle.idle_ns // 1000)
        del self._routes[corrid]
        sequence.ended = True
        if not sequence.requests:
            self._slots.release(sequence.slot)
        return True

    # ---- batches ----------------------------------------------------------------------------

    def pick(self, slots: list[Slot]) -> tuple[list[Slot], float | None]:
        """The slots whose next requests form the next batch of one instance, or ``[]`` and how
        long to wait (None: until woken) before asking again."""
        if self._delay_count:
            return [], None
        ready = [slot for slot in slots if slot.sequence is not None and slot.sequence.requests]
        if not ready:
            return [], None
        return self._strategy.pick(ready, time.monotonic_ns())

    async def run_batch(self, instance: ModelInstance, slots: list[Slot]) -> None:
        """Take the next request of each slot's sequence, add its control and state inputs, and run
        them as one batch on ``instance``."""
        requests, sequences = [], {}
        for slot in slots:
            sequence = slot.sequence
            assert sequence is not None
            request = sequence.requests.popleft()
            if request.sequence_start:
                sequence.state = None
            request.inputs.update((tensor.name, tensor) for tensor in self._controls.tensors(request))
            if self._states:
                request.inputs.update((tensor.name, tensor) for tensor in self._states.inputs(sequence.state))
            requests.append(request)
            sequences[id(request)] = sequence
            if sequence.ended and not sequence.requests:
                self._slots.release(slot)
        runner = StatefulExecution(instance, sequences, self._states) if self._states else None
        try:
            await self.pool.run(instance, requests, runner=runner)
        finally:
            self._queued -= len(requests)
            if not self._queued:
                self._drained.set()


class _InstanceBatcher:
    """Runs the batches of the sequences in one instance's slots, one batch at a time."""

    def __init__(self, scheduler: SequenceBatcher, instance: ModelInstance, number: int, slot_count: int) -> None:
        self.scheduler = scheduler
        self.instance = instance
        self.slots = [Slot(index, number, self.wake) for index in range(slot_count)]
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            batch, wait_s = self.scheduler.pick(self.slots)
            if batch:
                await self.scheduler.run_batch(self.instance, batch)
                continue
            with contextlib.suppress(TimeoutError):  # asyncio.timeout (Python 3.11+) raises the builtin one
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()
