"""The wire between front-end processes and the model owner: binary frames over a Unix socket (or over TCP, from
a front-end on another host: ``frontend_pool.serve_channel``).

A frame is a fixed header (kind, id, metadata length, tensor-data length), the metadata as a
``marshal``-ed tuple of plain values, then one buffer with every tensor's bytes. Tensors and errors
cross in wire.py's form (the form every process boundary uses), so each side builds numpy arrays
straight over the received frame.
"""
from __future__ import annotations

import asyncio
import marshal
import struct
from typing import Any

import numpy as np

from .datatypes import BY_NAME
from .inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from .frontend.trace import FrontendTrace
from .wire import TensorLayout, TensorRef, decode_error, encode_error, tensor_from

HEADER = struct.Struct("<BQII")  # kind, id, metadata bytes, tensor bytes

# front-end -> owner
REQUEST = 1  # meta: (model, version or -1, id, parameters, inputs, outputs, decoupled error or None,
#               None, or the caller's traceparent ("" for none) while the front-end notes trace timestamps)
CANCEL = 2  # the request with this id was cancelled by its client
CALL = 3  # meta: (method name, arguments): health, metadata and repository calls
STARTED = 4  # meta: (error text or None,): the front-end bound its ports (or could not)
# owner -> front-end
RESPONSE = 5  # meta: (final, has response, error or None, parameters, outputs, model version)
REPLY = 6  # meta: (ok, result, or (message, status name) when not ok)
LOG_SETTINGS = 7  # meta: the log settings as a dict (LogSettings.as_dict()): log as they say from now on
TRACED = 8  # the request with this id is traced: send its front-end timestamps back (TRACE_STAMPS)
TRACE_ARMED = 9  # meta: (armed,): note trace timestamps for every request from now on, or stop
# front-end -> owner, after its response
TRACE_STAMPS = 10  # meta: [(name, ns), ...]: the front-end's timestamps for the traced request with this id

Frame = tuple[int, int, Any, memoryview]


def encode(kind: int, frame_id: int, meta: Any, data: bytes | bytearray = b"") -> bytes:
    packed = marshal.dumps(meta)
    return b"".join((HEADER.pack(kind, frame_id, len(packed), len(data)), packed, data))


class FrameWriter:
    """Writes frames to a transport, coalescing those of one event-loop turn into one write: under load
    many requests and responses cross per turn, and each write is a system call and a wake-up."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    @property
    def closed(self) -> bool:
        return self.transport.is_closing()

    def write(self, frame: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(frame)

    def _flush(self) -> None:
        frames, self._pending = self._pending, []
        if not self.transport.is_closing():
            self.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))


class FrameReader:
    """Reassembles frames from a byte stream that may split or merge them anywhere."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        buffer = self._buffer
        buffer += data
        frames = []
        start, end = 0, len(buffer)
        while end - start >= HEADER.size:
            kind, frame_id, meta_size, data_size = HEADER.unpack_from(buffer, start)
            body = start + HEADER.size
            stop = body + meta_size + data_size
            if stop > end:
                break
            frame = bytes(buffer[body:stop])  # the tensors' arrays keep this copy alive
            frames.append((kind, frame_id, marshal.loads(frame[:meta_size]), memoryview(frame)[meta_size:]))
            start = stop
        del buffer[:start]
        return frames


def plain(value: Any) -> Any:
    """``value`` with numpy scalars turned into Python ones, so marshal can write it."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def _tensors(tensors: list[Tensor]) -> tuple[list[tuple[TensorRef, dict[str, Any] | None]], bytearray]:
    """Each tensor as (its TensorRef, its parameters or None), and the buffer of their bytes (wire.py). An input
    in a shared-memory region crosses with no bytes: the owner reads the region."""
    layout, described = TensorLayout(), []
    for tensor in tensors:
        if tensor.parameters and "shared_memory_region" in tensor.parameters:
            ref: TensorRef = (tensor.name, tensor.datatype, tuple(tensor.shape), 0, 0)
        else:
            ref = layout.add_tensor(tensor)
        described.append((ref, tensor.parameters or None))
    return described, layout.tobytes()


def _arrays(described: list[tuple[TensorRef, dict[str, Any] | None]], data: memoryview) -> list[Tensor]:
    tensors = []
    for ref, parameters in described:
        if parameters and "shared_memory_region" in parameters:  # its bytes are in a shared-memory region
            tensors.append(Tensor(ref[0], ref[1], ref[2], np.empty(0, BY_NAME[ref[1]].numpy), parameters))
        else:
            tensors.append(tensor_from(data, ref, parameters))
    return tensors


# ---- requests ------------------------------------------------------------------------------------

def encode_request(frame_id: int, request: InferenceRequest, decoupled_error: str | None) -> bytes:
    inputs, data = _tensors(list(request.inputs.values()))
    outputs = [(output.name, output.parameters or None) for output in request.outputs]
    version = -1 if request.model_version is None else request.model_version
    trace = None if request.trace is None else request.trace.parent or ""
    meta = (request.model_name, version, request.id, request.parameters or None, inputs, outputs, decoupled_error,
            trace)
    try:
        return encode(REQUEST, frame_id, meta, data)
    except ValueError:  # a parameter holds something marshal cannot write
        return encode(REQUEST, frame_id, plain(meta), data)


def decode_request(meta: Any, data: memoryview) -> tuple[InferenceRequest, str | None]:
    model, version, request_id, parameters, inputs, outputs, decoupled_error, trace = meta
    request = InferenceRequest(
        model, None if version < 0 else version, id=request_id,
        inputs={tensor.name: tensor for tensor in _arrays(inputs, data)},
        outputs=[RequestedOutput(name, parameters or {}) for name, parameters in outputs],
        parameters=parameters or {})
    if trace is not None:
        request.trace = FrontendTrace(trace)
    return request, decoupled_error


# ---- responses -----------------------------------------------------------------------------------

def encode_response(frame_id: int, response: InferenceResponse | None, final: bool, version: int | None) -> bytes:
    """A response frame; ``version`` is the model version the owner resolved for the request."""
    if response is None:
        return encode(RESPONSE, frame_id, (final, False, None, None, None, version))
    if response.error is not None:
        return encode(RESPONSE, frame_id, (final, True, encode_error(response.error), None, None, version))
    outputs, data = _tensors(response.outputs)
    meta = (final, True, None, response.parameters or None, outputs, version)
    try:
        return encode(RESPONSE, frame_id, meta, data)
    except ValueError:
        return encode(RESPONSE, frame_id, plain(meta), data)


def decode_response(meta: Any, data: memoryview) -> tuple[InferenceResponse | None, bool, int | None]:
    """(response or None for a bare final flag, final, the resolved model version)."""
    final, has_response, error, parameters, outputs, version = meta
    if not has_response:
        return None, final, version
    if error is not None:
        return InferenceResponse.from_error(decode_error(error)), final, version
    return InferenceResponse(_arrays(outputs, data), parameters or {}), final, version
