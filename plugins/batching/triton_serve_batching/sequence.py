"""Triton's sequence batcher: each sequence's requests run in order on one instance, with control
inputs, implicit state and idle-sequence expiry."""
from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from triton_serve.plugin import (InferenceRequest, InferenceResponse, ModelConfig, ModelContext, ModelInstance,
                                 ModelSequenceBatching, ModelSpec, RequestedOutput, Scheduler, ServerError, Status,
                                 Tensor, TensorType, datatype_of_config, from_wire_bytes, request_batch_size)

from .delay import delay_scheduler_count

log = logging.getLogger(__name__)

Control = ModelSequenceBatching.Control
CorrelationId = int | str

DEFAULT_MAX_SEQUENCE_IDLE_US = 1_000_000
BACKLOG_RECHECK_NS = 50_000_000  # how often the reaper revisits an idle sequence still in the backlog
_FLAG_TYPES = {"INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_}


# ---- control inputs ----------------------------------------------------------------------------

class SequenceControls:
    """The control input tensors (START, END, READY, CORRID) that ``sequence_batching.control_input``
    asks for, shaped ``[1]`` (``[1, 1]`` when the model batches)."""

    def __init__(self, config: ModelConfig) -> None:
        self._model = config.name
        self._shape = (1, 1) if config.max_batch_size > 0 else (1,)
        self._flags: list[tuple[str, int, str, tuple[float, float]]] = []  # name, kind, datatype, (false, true)
        self._corrid: tuple[str, TensorType] | None = None
        for control_input in config.sequence_batching.control_input:
            for control in control_input.control:
                if control.kind == Control.CONTROL_SEQUENCE_CORRID:
                    self._corrid = (control_input.name, datatype_of_config(control.data_type))
                elif control.int32_false_true:
                    self._flags.append((control_input.name, control.kind, "INT32", tuple(control.int32_false_true)))
                elif control.fp32_false_true:
                    self._flags.append((control_input.name, control.kind, "FP32", tuple(control.fp32_false_true)))
                else:
                    self._flags.append((control_input.name, control.kind, "BOOL", tuple(control.bool_false_true)))

    def check_correlation_id(self, request: InferenceRequest) -> None:
        """Reject a correlation id the CORRID control cannot carry."""
        corrid = request.sequence_id
        if isinstance(corrid, int) and not 0 < corrid < 2 ** 64:
            raise ServerError(f"inference request to model '{request.model_name}' has correlation ID {corrid}, "
                              "which is not an unsigned 64-bit integer")
        if isinstance(corrid, str) and self._corrid is not None and self._corrid[1].name != "BYTES":
            name, datatype = self._corrid
            raise ServerError(f"inference request to model '{request.model_name}' has string correlation ID "
                              f"'{corrid}', but the model's CORRID control input '{name}' is "
                              f"{datatype.config_name}")

    def tensors(self, request: InferenceRequest) -> list[Tensor]:
        """The control tensors for ``request``; READY is always true (no filler requests are sent)."""
        tensors = []
        for name, kind, datatype, false_true in self._flags:
            on = {Control.CONTROL_SEQUENCE_START: request.sequence_start,
                  Control.CONTROL_SEQUENCE_END: request.sequence_end}.get(kind, True)
            tensors.append(Tensor(name, datatype, self._shape,
                                  np.full(self._shape, false_true[on], dtype=_FLAG_TYPES[datatype])))
        if self._corrid is not None:
            name, datatype = self._corrid
            corrid = request.sequence_id
            if datatype.name == "BYTES":
                data = np.full(self._shape, str(corrid).encode(), dtype=np.object_)
            else:  # 32-bit types take the id's low bits, as Triton's do
                data = np.full(self._shape, corrid, dtype=np.uint64).astype(datatype.numpy)
            tensors.append(Tensor(name, datatype.name, self._shape, data))
        return tensors


# ---- implicit state ----------------------------------------------------------------------------

class ImplicitStates:
    """The config's implicit states (``sequence_batching.state``): each one's initial value, and the
    state tensors each request of a sequence gets."""

    def __init__(self, model: ModelSpec) -> None:
        config = model.config
        self._specs: list[tuple[ModelSequenceBatching.State, TensorType, np.ndarray]] = []
        seen: set[str] = set()
        for state in config.sequence_batching.state:
            if state.input_name in seen:
                raise ServerError(f"State input name '{state.input_name}' specified more than once.")
            seen.add(state.input_name)
            datatype = datatype_of_config(state.data_type)
            self._specs.append((state, datatype, _initial_state(model, state, datatype)))
        self.output_names = [state.output_name for state, _, _ in self._specs]
        self._declared_outputs = {output.name for output in config.output}

    def __bool__(self) -> bool:
        return bool(self._specs)

    def inputs(self, carried: dict[str, np.ndarray] | None) -> list[Tensor]:
        """The state input tensors: the previous request's state outputs, else the initial values."""
        tensors = []
        for state, datatype, initial in self._specs:
            data = initial if carried is None else carried.get(state.input_name, initial)
            tensors.append(Tensor(state.input_name, datatype.name, tuple(data.shape), data))
        return tensors

    def take(self, response: InferenceResponse, carried: dict[str, np.ndarray] | None,
             requested: set[str]) -> dict[str, np.ndarray]:
        """The state to carry after ``response``; removes state outputs the client may not see
        (undeclared in the config's outputs, or not among the outputs it asked for)."""
        kept = dict(carried or {})
        for state, datatype, _ in self._specs:
            tensor = response.output(state.output_name)
            if tensor is None:
                continue  # a model that does not update a state keeps the previous one
            data = np.asarray(tensor.data)
            kept[state.input_name] = data if datatype.name == "BYTES" else data.astype(datatype.numpy, copy=False)
            if state.output_name not in self._declared_outputs or (requested and state.output_name not in requested):
                response.outputs.remove(tensor)
        return kept


def _initial_state(model: ModelSpec, state: ModelSequenceBatching.State, datatype: TensorType) -> np.ndarray:
    """A state's value for the first request of a sequence (zeros unless ``initial_state`` says otherwise)."""
    batch = [1] if model.config.max_batch_size > 0 else []
    if not state.initial_state:
        return _zeros(tuple(batch + [1 if d == -1 else d for d in state.dims]), datatype)
    if len(state.initial_state) > 1:
        raise ServerError(f"initial_state field for state input '{state.input_name}' must contain exactly one or "
                          f"zero element. Found '{len(state.initial_state)}' elements.")
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        raise ServerError(f"The data type used for 'initial_state' field of state '{state.input_name}' does not "
                          "match the state data type.")
    if not initial.name:
        raise ServerError(f"Field 'name' must be set when using initial_state for state input '{state.input_name}'.")
    if len(initial.dims) != len(state.dims):
        raise ServerError(f"Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions "
                          f"for state input '{state.input_name}'. {len(initial.dims)} != {len(state.dims)}")
    for initial_dim, state_dim in zip(initial.dims, state.dims):
        if initial_dim == -1:
            raise ServerError(f"'initial_state' field for state input name '{state.input_name}' contains variable "
                              "dimensions.")
        if state_dim != -1 and initial_dim != state_dim:
            raise ServerError(f"'initial_state' dim for input name '{state.input_name}' doesn't match 'state' dim "
                              f"description. {initial_dim} != {state_dim}")
    shape = tuple(batch + list(initial.dims))
    if initial.WhichOneof("state_data") != "data_file":
        return _zeros(shape, datatype)
    path = model.model_dir / "initial_state" / initial.data_file
    try:
        content = path.read_bytes()
    except OSError as error:
        raise ServerError(f"failed to read initial_state data file '{path}' for state input "
                          f"'{state.input_name}': {error.strerror}") from None
    count = int(np.prod(shape))
    if datatype.name != "BYTES":
        expected = count * datatype.itemsize
        if len(content) < expected:
            raise ServerError(f"initial_state setting expects {expected} bytes, but the data provided from "
                              f"{initial.data_file} only has {len(content)} bytes.")
        content = content[:expected]
    try:
        return from_wire_bytes(datatype.name, shape, content).copy()
    except ValueError as error:
        raise ServerError(f"initial_state data file '{initial.data_file}' for state input "
                          f"'{state.input_name}' does not hold {count} elements: {error}") from None


def _zeros(shape: tuple[int, ...], datatype: TensorType) -> np.ndarray:
    if datatype.name == "BYTES":
        return np.full(shape, b"", dtype=np.object_)
    return np.zeros(shape, dtype=datatype.numpy)


class _StatefulExecution(ModelInstance):
    """Runs one batch on a model instance and carries implicit state: each sequence's state
    outputs become its next request's state inputs, and are taken out of the responses."""

    def __init__(self, instance: ModelInstance, sequences: dict[int, _Sequence], states: ImplicitStates) -> None:
        self._instance = instance
        self._sequences = sequences  # by id() of each request (the pool leaves cancelled ones out)
        self._states = states

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse] | None:
        asked = [list(request.outputs) for request in requests]
        for request in requests:
            if request.outputs:  # a backend returns only what is asked for: ask for the states too
                named = {output.name for output in request.outputs}
                request.outputs.extend(RequestedOutput(name) for name in self._states.output_names if name not in named)
        try:
            responses = await self._instance.execute(requests)
        finally:
            for request, outputs in zip(requests, asked):
                request.outputs = outputs
        if responses is None:
            return None
        for request, response, outputs in zip(requests, responses, asked):
            if response.error is None:
                sequence = self._sequences[id(request)]
                sequence.state = self._states.take(response, sequence.state, {o.name for o in outputs})
        return responses

    def is_ready(self) -> bool:
        return self._instance.is_ready()

    def not_ready_reason(self) -> str:
        return self._instance.not_ready_reason()


# ---- sequences, slots and strategies -----------------------------------------------------------

class _Sequence:
    """One sequence: its queued requests and implicit state; in a slot, or waiting in the backlog."""

    __slots__ = ("corrid", "ended", "requests", "slot", "state")

    def __init__(self, corrid: CorrelationId) -> None:
        self.corrid = corrid
        self.requests: deque[InferenceRequest] = deque()
        self.state: dict[str, np.ndarray] | None = None
        self.ended = False  # END was received or the sequence expired: no more requests will join
        self.slot: _Slot | None = None


class _Slot:
    """One batch slot of one instance; holds at most one sequence."""

    __slots__ = ("batcher", "index", "sequence")

    def __init__(self, batcher: _InstanceBatcher, index: int) -> None:
        self.batcher = batcher
        self.index = index
        self.sequence: _Sequence | None = None

    def next_enqueued_ns(self) -> int:
        return self.sequence.requests[0].enqueued_ns  # type: ignore[union-attr]


class _DirectStrategy:
    """``direct``: every slot with a request joins the batch, unless ``max_queue_delay_microseconds``
    and ``minimum_slot_utilization`` together say to wait for more slots to fill."""

    def __init__(self, settings: ModelSequenceBatching.StrategyDirect, max_batch: int) -> None:
        self._delay_ns = settings.max_queue_delay_microseconds * 1000
        self._utilization = settings.minimum_slot_utilization
        self._max_batch = max_batch

    def pick(self, ready: list[_Slot], now_ns: int) -> tuple[list[_Slot], float | None]:
        if self._delay_ns and self._utilization:
            waited = now_ns - min(slot.next_enqueued_ns() for slot in ready)
            if waited <= self._delay_ns and len(ready) / self._max_batch < self._utilization:
                return [], (self._delay_ns - waited) / 1e9
        return ready, None


class _OldestStrategy:
    """``oldest``: a dynamic batch of the oldest next requests of the candidate sequences, at most
    one per sequence, honouring ``preferred_batch_size`` and ``max_queue_delay_microseconds``."""

    def __init__(self, settings: ModelSequenceBatching.StrategyOldest, max_batch: int) -> None:
        self._delay_ns = settings.max_queue_delay_microseconds * 1000
        self._preferred = sorted(settings.preferred_batch_size)
        self._max_batch = max_batch

    def pick(self, ready: list[_Slot], now_ns: int) -> tuple[list[_Slot], float | None]:
        ready = sorted(ready, key=_Slot.next_enqueued_ns)
        size = min(len(ready), self._max_batch)
        if size < self._max_batch:
            preferred = [p for p in self._preferred if p <= size]
            if preferred:
                size = preferred[-1]
            elif self._delay_ns:
                waited = now_ns - ready[0].next_enqueued_ns()
                if waited < self._delay_ns:
                    return [], (self._delay_ns - waited) / 1e9
        return ready[:size], None


class _InstanceBatcher:
    """Runs the batches of the sequences in one instance's slots, one batch at a time."""

    def __init__(self, scheduler: SequenceBatcher, instance: ModelInstance, number: int, slot_count: int) -> None:
        self.scheduler = scheduler
        self.instance = instance
        self.number = number
        self.slots = [_Slot(self, index) for index in range(slot_count)]
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
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)


# ---- the scheduler -----------------------------------------------------------------------------

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
            self._strategy: _DirectStrategy | _OldestStrategy = _OldestStrategy(settings.oldest, max_batch)
            slot_count = settings.oldest.max_candidate_sequences or max_batch
        else:
            self._strategy = _DirectStrategy(settings.direct, max_batch)
        self._idle_ns = (settings.max_sequence_idle_microseconds or DEFAULT_MAX_SEQUENCE_IDLE_US) * 1000
        self._batchers = [_InstanceBatcher(self, instance, number, slot_count)
                          for number, instance in enumerate(self.pool.instances)]
        self._free = [(slot.index, batcher.number, slot) for batcher in self._batchers for slot in batcher.slots]
        heapq.heapify(self._free)
        self._routes: dict[CorrelationId, _Sequence] = {}  # sequences that still accept requests
        self._backlog: deque[_Sequence] = deque()
        self._last_seen: dict[CorrelationId, int] = {}
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
        self._tasks.append(loop.create_task(self._reap_idle_sequences()))

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
        if corrid == 0 or corrid == "":
            raise ServerError(f"inference request to model '{model}' must specify a non-zero or non-empty "
                              "correlation ID")
        self._controls.check_correlation_id(request)
        if self._stopped or (self._stopping and request.sequence_start):
            raise ServerError("Server is stopping, scheduler for model has stopped accepting new inference requests",
                              Status.UNAVAILABLE)
        sequence = self._routes.get(corrid)
        if sequence is None and not request.sequence_start:
            raise ServerError(f"inference request for sequence {corrid} to model '{model}' must specify the START "
                              "flag on the first request of the sequence")
        if sequence is None:
            sequence = self._routes[corrid] = _Sequence(corrid)
            self._place(sequence)
        elif request.sequence_start:
            log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                        "sequence start. Previous sequence will be terminated early.", corrid, model)
        sequence.requests.append(request)
        if request.sequence_end:
            sequence.ended = True
            del self._routes[corrid]
        self._last_seen[corrid] = time.monotonic_ns()
        self._accepted += 1
        self._queued += 1
        self._drained.clear()
        if self._delay_count and self._accepted >= self._delay_count:
            self._delay_count = 0
            for batcher in self._batchers:
                batcher.wake()
        elif sequence.slot is not None:
            sequence.slot.batcher.wake()

    # ---- slots ------------------------------------------------------------------------------

    def _place(self, sequence: _Sequence) -> None:
        if not self._free:
            self._backlog.append(sequence)
            return
        _, _, slot = heapq.heappop(self._free)
        slot.sequence, sequence.slot = sequence, slot

    def _release(self, slot: _Slot) -> None:
        """Free a slot: the oldest backlogged sequence takes it, else it waits for a new sequence."""
        slot.sequence = None
        if self._backlog:
            sequence = self._backlog.popleft()
            slot.sequence, sequence.slot = sequence, slot
            slot.batcher.wake()
        else:
            heapq.heappush(self._free, (slot.index, slot.batcher.number, slot))

    async def _reap_idle_sequences(self) -> None:
        while True:
            now = time.monotonic_ns()
            sleep_ns = self._idle_ns
            for corrid, seen in list(self._last_seen.items()):
                remaining = seen + self._idle_ns - now
                sequence = self._routes.get(corrid)
                if remaining > 0 or (sequence is not None and sequence.slot is None):
                    sleep_ns = min(sleep_ns, remaining if remaining > 0 else BACKLOG_RECHECK_NS)
                    continue
                del self._last_seen[corrid]
                if sequence is None:
                    continue  # it ended already
                log.info("sequence %s of model '%s' was idle for more than %d us; releasing it",
                         corrid, self.model.name, self._idle_ns // 1000)
                del self._routes[corrid]
                sequence.ended = True
                if not sequence.requests:
                    self._release(sequence.slot)  # type: ignore[arg-type]
            await asyncio.sleep(sleep_ns / 1e9)

    # ---- batches ----------------------------------------------------------------------------

    def pick(self, slots: list[_Slot]) -> tuple[list[_Slot], float | None]:
        """The slots whose next requests form the next batch of one instance, or ``[]`` and how
        long to wait (None: until woken) before asking again."""
        if self._delay_count:
            return [], None
        ready = [slot for slot in slots if slot.sequence is not None and slot.sequence.requests]
        if not ready:
            return [], None
        return self._strategy.pick(ready, time.monotonic_ns())

    async def run_batch(self, instance: ModelInstance, slots: list[_Slot]) -> None:
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
                self._release(slot)
        runner = _StatefulExecution(instance, sequences, self._states) if self._states else None
        try:
            await self.pool.run(instance, requests, runner=runner)
        finally:
            self._queued -= len(requests)
            if not self._queued:
                self._drained.set()
