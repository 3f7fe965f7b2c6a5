"""Protocol-neutral inference requests, responses and tensors shared by front-ends, schedulers and backends."""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from .datatypes import BY_NAME, check_bytes_elements, element_count, from_wire_bytes, to_wire_bytes
from .errors import ServerError, Status

Parameters = dict[str, Any]
# The request parameters that set a request's scheduling fields (route.apply_reserved_parameters reads them).
RESERVED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout"})


class Tensor:
    """A named tensor. ``data`` is a numpy array; BYTES tensors hold an object array of ``bytes``.

    A tensor made by ``from_wire`` keeps the bytes it arrived in (``wire``: numbers little-endian, BYTES
    length-prefixed, as KServe's binary extension and every process boundary carry them) and builds ``data``
    from them only when something asks: what a client sends reaches a Python model's worker, and a worker's
    outputs reach the client, without becoming arrays, Python objects or copies in between. Setting ``data`` drops
    the wire bytes.
    """

    __slots__ = ("name", "datatype", "shape", "parameters", "wire", "_data")

    def __init__(self, name: str, datatype: str, shape: tuple[int, ...], data: np.ndarray,
                 parameters: Parameters | None = None) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.parameters: Parameters = parameters if parameters is not None else {}
        self.wire: bytes | bytearray | memoryview | None = None
        self._data: np.ndarray | None = data

    @classmethod
    def from_wire(cls, name: str, datatype: str, shape: tuple[int, ...], buffer: bytes | bytearray | memoryview,
                  parameters: Parameters | None = None) -> Tensor:
        """A tensor over ``buffer``, its elements in wire form (``buffer`` must not change afterwards). Raise
        ValueError (StringCountError for a BYTES count) when ``buffer`` does not hold ``shape``'s elements."""
        count = element_count(shape)
        if datatype == "BYTES":
            check_bytes_elements(buffer, count)
        elif len(buffer) != count * BY_NAME[datatype].itemsize:
            raise ValueError(f"expected {count * BY_NAME[datatype].itemsize} bytes, got {len(buffer)}")
        tensor = cls(name, datatype, shape, None, parameters)  # type: ignore[arg-type]
        tensor.wire = buffer
        return tensor

    @property
    def data(self) -> np.ndarray:
        """The elements as a numpy array (built from ``wire`` on first use)."""
        if self._data is None:
            self._data = from_wire_bytes(self.datatype, self.shape, self.wire)  # type: ignore[arg-type]
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._data = value
        self.wire = None

    @property
    def size(self) -> int:
        """The number of elements."""
        return element_count(self.shape) if self._data is None else int(self._data.size)

    def reshape(self, shape: tuple[int, ...]) -> None:
        """Give the tensor a new shape of the same element count (the wire bytes, if kept, stay as they are)."""
        if self._data is not None:
            self._data = self._data.reshape(shape)
        self.shape = tuple(shape)

    def wire_bytes(self) -> bytes | bytearray | memoryview:
        """The elements in wire form: the bytes the tensor arrived in, or ``data`` encoded."""
        return self.wire if self.wire is not None else to_wire_bytes(self.datatype, self.data)

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.datatype}, shape={list(self.shape)})"


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output parameters (binary_data, classification...)."""

    name: str
    parameters: Parameters = field(default_factory=dict)


# Field metadata that tells the codec (wire.py) how a content field crosses a process boundary; a field without
# it crosses as a plain value (None, bool, int, float, str, bytes, and lists, tuples and dicts of them).
TENSORS = {"wire": "tensors"}  # a tuple of Tensors: descriptors in the metadata, bytes in the tensor buffer
REQUESTED_OUTPUTS = {"wire": "requested_outputs"}  # a tuple of RequestedOutputs
ERROR = {"wire": "error"}  # a ServerError or None


@dataclass(frozen=True, slots=True)
class RequestContent:
    """What a client asked of a model, and nothing else: the one form of a request that crosses a process
    boundary (front-end process to model owner, owner to a worker process, a front door to a Ray replica), in
    wire.py's one encoding. A field added here (or in a subclass set as ``InferenceRequest.content_type``)
    crosses every boundary with no change to the codec. Frozen: no field is rebound once it is made (its
    parameters dict and tensors are shared with the request it came from, not copied)."""

    model_name: str
    model_version: int | None = None  # None: the model's policy picks (the latest)
    id: str = ""
    parameters: Parameters = field(default_factory=dict)
    inputs: tuple[Tensor, ...] = field(default=(), metadata=TENSORS)
    outputs: tuple[RequestedOutput, ...] = field(default=(), metadata=REQUESTED_OUTPUTS)


@dataclass(frozen=True, slots=True)
class ResponseContent:
    """One response as it crosses a process boundary: output tensors and response parameters, or an error.
    Whether it is a request's final response is the delivery's business (``InferenceRequest.send``)."""

    outputs: tuple[Tensor, ...] = field(default=(), metadata=TENSORS)
    parameters: Parameters = field(default_factory=dict)
    error: ServerError | None = field(default=None, metadata=ERROR)


@dataclass(slots=True)
class InferenceResponse:
    """One response: output tensors and response parameters, or an error. A backend builds and may change it;
    ``content`` is its immutable form for a process boundary, ``from_content`` the response a receiver makes."""

    # The content type responses cross in; a subclass set here adds fields (set it before any process starts:
    # front-end processes and worker processes are told at start-up, ``wire.content_type_names``).
    content_type: ClassVar[type[ResponseContent]] = ResponseContent

    outputs: list[Tensor] = field(default_factory=list)
    parameters: Parameters = field(default_factory=dict)
    error: ServerError | None = None
    _received: ResponseContent | None = field(default=None, init=False, repr=False, compare=False)  # made from

    @classmethod
    def from_error(cls, error: ServerError) -> InferenceResponse:
        """A response that fails its request with ``error``."""
        return cls(error=error)

    @classmethod
    def from_content(cls, content: ResponseContent) -> InferenceResponse:
        """The response ``content`` describes (received from another process); ``content`` keeps what it carries
        beyond these fields for the next boundary."""
        response = cls(list(content.outputs), content.parameters, content.error)
        response._received = content
        return response

    @property
    def content(self) -> ResponseContent:
        """The response as it stands, as content (fields it was received with and does not hold kept)."""
        if self._received is None:
            return self.content_type(tuple(self.outputs), self.parameters, self.error)
        return replace(self._received, outputs=tuple(self.outputs), parameters=self.parameters, error=self.error)

    def output(self, name: str) -> Tensor | None:
        """The output tensor called ``name``, or None."""
        for tensor in self.outputs:
            if tensor.name == name:
                return tensor
        return None


# Receives a request's responses as they are sent: ``(response, final)``; ``None`` is a bare final flag.
ResponseSink = Callable[["InferenceResponse | None", bool], None]
# The data plane's step between a backend's ``send`` and the consumer (output shaping, statistics).
ResponseFilter = Callable[["InferenceRequest", "InferenceResponse | None", bool], "InferenceResponse | None"]


class InferenceRequest:
    """A request to one model, and the channel its 0..N responses travel back on.

    Front-ends build requests (or ``from_content``, one received from another process); the data plane validates
    them and hands them to the model's scheduler; a backend answers through ``send`` (or by returning responses
    from ``ModelInstance.execute``). ``send`` must be called on the server's event loop. The consumer either sets
    a sink (``set_sink``: called at once for each response, no task or queue) or reads ``responses()``.

    What the client asked (``model_name``, ``model_version``, ``id``, ``parameters``, ``inputs``, ``outputs``) is
    the request's working copy of its content: the data plane resolves the version, a sequence batcher adds
    control inputs. ``content`` is its immutable form, the only thing that crosses a process boundary; the rest
    (priority, timeout, sequence fields, cancellation, times, the response gate, sink and filter) is scheduling
    state and response delivery, which stay in the process.
    """

    # The content type requests cross in; a subclass set here adds fields (set it before any process starts:
    # front-end processes and worker processes are told at start-up, ``wire.content_type_names``).
    content_type: ClassVar[type[RequestContent]] = RequestContent

    __slots__ = (
        "model_name", "model_version", "id", "inputs", "outputs", "parameters", "priority",
        "timeout_us", "sequence_id", "sequence_start", "sequence_end", "cancelled", "arrival_ns",
        "enqueued_ns", "response_gate", "on_cancel", "trace", "_finished", "_filter", "_sink", "_pending",
        "_waiter", "_held", "_received",
    )

    def __init__(
        self,
        model_name: str,
        model_version: int | None = None,
        *,
        id: str = "",
        inputs: dict[str, Tensor] | None = None,
        outputs: list[RequestedOutput] | None = None,
        parameters: Parameters | None = None,
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.inputs: dict[str, Tensor] = inputs if inputs is not None else {}
        self.outputs: list[RequestedOutput] = outputs if outputs is not None else []
        self.parameters: Parameters = parameters if parameters is not None else {}
        self.priority = 0
        self.timeout_us = 0
        self.sequence_id: int | str = 0
        self.sequence_start = False
        self.sequence_end = False
        self.cancelled = asyncio.Event()
        self.arrival_ns = time.monotonic_ns()  # when the front-end received it
        self.enqueued_ns = self.arrival_ns  # when the data plane handed it to the scheduler
        # A scheduler may set a future here: responses reach the client only once it is done
        # (the dynamic batcher's preserve_ordering).
        self.response_gate: asyncio.Future[None] | None = None
        # Called once by ``cancel`` (a front-end process forwards the cancellation to the model owner).
        self.on_cancel: Callable[[], None] | None = None
        # A front-end's FrontendTrace while tracing is armed, or what InferenceClient sets (tracing.inherit);
        # from DataPlane.submit on, the request's Trace when it is traced, else None (triton_serve._engine.tracing).
        self.trace: Any = None
        self._finished = False
        self._filter: ResponseFilter | None = None
        self._sink: ResponseSink | None = None
        self._pending: deque[tuple[InferenceResponse | None, bool]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._held: list[tuple[InferenceResponse | None, bool]] | None = None
        self._received: RequestContent | None = None  # the content it was made from, with any fields of a subclass

    @classmethod
    def from_content(cls, content: RequestContent) -> InferenceRequest:
        """The request ``content`` describes (received from another process)."""
        request = cls(content.model_name, content.model_version, id=content.id,
                      inputs={tensor.name: tensor for tensor in content.inputs}, outputs=list(content.outputs),
                      parameters=content.parameters)
        request._received = content
        return request

    @property
    def content(self) -> RequestContent:
        """What the client asked, as it stands now (version resolved, inputs added), as immutable content; the
        fields of a received content that the request does not hold cross on with it."""
        inputs, outputs = tuple(self.inputs.values()), tuple(self.outputs)
        if self._received is None:
            return self.content_type(self.model_name, self.model_version, self.id, self.parameters, inputs, outputs)
        return replace(self._received, model_name=self.model_name, model_version=self.model_version, id=self.id,
                       parameters=self.parameters, inputs=inputs, outputs=outputs)

    @property
    def finished(self) -> bool:
        """True once the final response (or final flag) has been sent."""
        return self._finished

    def cancel(self) -> None:
        """Mark the request cancelled (the client went away): queued, it will not run."""
        if not self.cancelled.is_set():
            self.cancelled.set()
            if self.on_cancel is not None:
                self.on_cancel()

    def when_cancelled(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the request is cancelled, after what ``on_cancel`` already does; at once when it is
        cancelled already (event loop)."""
        if self.cancelled.is_set():
            callback()
            return
        before = self.on_cancel

        def cancelled() -> None:
            if before is not None:
                before()
            callback()
        self.on_cancel = cancelled

    def set_sink(self, sink: ResponseSink) -> None:
        """Deliver every response to ``sink`` as it is sent (set before the request is submitted)."""
        self._sink = sink

    def set_filter(self, response_filter: ResponseFilter) -> None:
        """Pass every response through ``response_filter`` before it reaches the consumer (the data plane's)."""
        self._filter = response_filter

    def send(self, response: InferenceResponse | None, *, final: bool = True) -> None:
        """Send one response; ``final`` closes the stream. ``None`` sends only the final flag."""
        if self._finished:
            raise RuntimeError(f"request {self.id!r} to '{self.model_name}' already sent its final response")
        self._finished = final
        if self._filter is not None:
            response = self._filter(self, response, final)
        gate = self.response_gate
        if self._held is not None or (gate is not None and not gate.done()):
            if self._held is None:
                self._held = []
                gate.add_done_callback(self._release_held)  # type: ignore[union-attr]
            self._held.append((response, final))
            return
        self._deliver(response, final)

    def fail(self, error: ServerError) -> None:
        """Answer with an error as the final response, unless already finished."""
        if not self._finished:
            self.send(InferenceResponse.from_error(error))

    def _release_held(self, _gate: asyncio.Future[None]) -> None:
        held, self._held = self._held or [], None
        for response, final in held:
            self._deliver(response, final)

    def _deliver(self, response: InferenceResponse | None, final: bool) -> None:
        sink = self._sink
        if sink is not None:
            if final:  # nothing follows: a sink or filter that refers back to the request no longer keeps it alive
                self._sink = self._filter = None
            sink(response, final)
            return
        self._pending.append((response, final))
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def responses(self) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        """Yield ``(response, final)`` pairs until the final one (for consumers without a sink)."""
        while True:
            while not self._pending:
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter
            response, final = self._pending.popleft()
            yield response, final
            if final:
                return

    async def single_response(self) -> InferenceResponse:
        """Wait for the one response of a non-decoupled request."""
        while True:
            while not self._pending:
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter
            response, final = self._pending.popleft()
            if response is not None:
                return response
            if final:
                raise ServerError(f"model '{self.model_name}' sent no response", Status.INTERNAL)
