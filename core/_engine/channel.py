"""The wire between front-end processes and the model owner: binary frames over a Unix socket (or over TCP, from
a front-end on another host: ``frontend_pool.serve_channel``).

A frame is a fixed header (kind, id, metadata length, tensor-data length), the metadata as a
``marshal``-ed tuple of plain values, then one buffer with every tensor's bytes. Requests and responses cross as
their content in wire.py's codec (the form every process boundary uses), so each side builds its tensors straight
over the received frame; nothing here lists a content field.
"""
from __future__ import annotations

import asyncio
import marshal
import struct
from typing import Any

from .inference import InferenceRequest, InferenceResponse
from .frontend.trace import FrontendTrace
from .wire import decode_content, pack_content, plain

HEADER = struct.Struct("<BQII")  # kind, id, metadata bytes, tensor bytes

# front-end -> owner
REQUEST = 1  # meta: (RequestContent's metadata (wire.encode_content), decoupled error or None,
#               None, or the caller's traceparent ("" for none) while the front-end notes trace timestamps)
CANCEL = 2  # the request with this id was cancelled by its client
CALL = 3  # meta: (method name, arguments): health, metadata and repository calls
STARTED = 4  # meta: (error text or None,): the front-end bound its ports (or could not)
# owner -> front-end
RESPONSE = 5  # meta: (final, ResponseContent's metadata or None for a bare final flag, model version)
REPLY = 6  # meta: (ok, result, or (message, status name) when not ok)
LOG_SETTINGS = 7  # meta: the log settings as a dict (LogSettings.as_dict()): log as they say from now on; a
#                   nonzero id is answered SETTINGS_APPLIED once they are in force
TRACED = 8  # the request with this id is traced: send its front-end timestamps back (TRACE_STAMPS)
TRACE_ARMED = 9  # meta: (armed,): note trace timestamps for every request from now on, or stop; a nonzero id is
#                  answered SETTINGS_APPLIED once in force
# front-end -> owner, after its response
TRACE_STAMPS = 10  # meta: [(name, ns), ...]: the front-end's timestamps for the traced request with this id
SETTINGS_APPLIED = 11  # the LOG_SETTINGS or TRACE_ARMED frame with this id is in force in the front-end

Frame = tuple[int, int, Any, memoryview]


def encode(kind: int, frame_id: int, meta: Any, data: bytes | bytearray = b"") -> bytes:
    """One frame; metadata that marshal refuses (a numpy scalar among parameters) crosses as ``wire.plain(meta)``."""
    try:
        packed = marshal.dumps(meta)
    except ValueError:
        packed = marshal.dumps(plain(meta))
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


# ---- requests ------------------------------------------------------------------------------------

def encode_request(frame_id: int, request: InferenceRequest, decoupled_error: str | None) -> bytes:
    """A REQUEST frame: the request's content (wire.py's codec), and what the owner needs beside it."""
    meta, data = pack_content(request.content)
    trace = None if request.trace is None else request.trace.parent or ""
    return encode(REQUEST, frame_id, (meta, decoupled_error, trace), data)


def decode_request(meta: Any, data: memoryview) -> tuple[InferenceRequest, str | None]:
    """The request a REQUEST frame carries (its tensors views of the frame), and its decoupled error."""
    content, decoupled_error, trace = meta
    request = InferenceRequest.from_content(decode_content(InferenceRequest.content_type, content, data))
    if trace is not None:
        request.trace = FrontendTrace(trace)
    return request, decoupled_error


# ---- responses -----------------------------------------------------------------------------------

def encode_response(frame_id: int, response: InferenceResponse | None, final: bool, version: int | None) -> bytes:
    """A RESPONSE frame; ``version`` is the model version the owner resolved for the request."""
    if response is None:
        return encode(RESPONSE, frame_id, (final, None, version))
    meta, data = pack_content(response.content)
    return encode(RESPONSE, frame_id, (final, meta, version), data)


def decode_response(meta: Any, data: memoryview) -> tuple[InferenceResponse | None, bool, int | None]:
    """(response or None for a bare final flag, final, the resolved model version)."""
    final, content, version = meta
    if content is None:
        return None, final, version
    return InferenceResponse.from_content(decode_content(InferenceResponse.content_type, content, data)), final, version
