"""The server <-> worker wire over a Unix socket pair: frames of a fixed binary header and a marshal body.

A frame is ``<kind: u8><body length: u32 LE>`` and then the body: plain values (None, bool, int, float, str,
tuple, list, dict) in ``marshal`` format, which is fast and needs no pickle; both ends run the same interpreter,
as marshal's format requires. Only metadata travels here; tensor bytes travel through the shared-memory arenas
(arena.py).
"""
from __future__ import annotations

import marshal
import socket
import struct
import threading
from enum import IntEnum
from typing import Any

from .arena import TensorRef

_HEADER = struct.Struct("<BI")


class Kind(IntEnum):
    """What a frame carries; the comment gives its body."""

    # server -> worker
    INIT = 1  # init dict: model_file, outputs, args, input_arena, output_arena
    EXECUTE = 2  # (new input arena name or None, [RequestTuple, ...])
    GROWN = 3  # (new output arena name or None, error text or None)
    FINALIZE = 4  # None
    # worker -> server
    STARTED = 5  # None: the process is up and waits for INIT
    READY = 6  # None
    FAILED = 7  # (message, traceback text)
    RESULT = 8  # (BatchError or None, [ResponseTuple, ...] or None); the server swaps in core responses
    GROW = 9  # bytes needed in the output arena
    LOG = 10  # (level name, line)
    FINALIZED = 11  # None


_KINDS = {kind.value: kind for kind in Kind}  # a dict lookup is several times faster than Kind(code)
Message = tuple[Kind, Any]  # (kind, body)
# One request of an EXECUTE: (id, correlation id, flags, timeout in µs, requested output names, parameters, inputs).
RequestTuple = tuple[str, int | str, int, int, list[str], dict[str, Any], list[TensorRef]]
# One response of a RESULT: (output refs, parameters, None) or (None, None, (error message, status code name)).
ResponseTuple = tuple[list[TensorRef] | None, dict[str, Any] | None, tuple[str, str] | None]
# A batch that failed as a whole: (message, status code name, traceback text or None).
BatchError = tuple[str, str, str | None]


def encode(kind: Kind, body: Any = None) -> bytes:
    """One frame; ValueError if ``body`` holds a value marshal cannot write (an object, an enum, a subclass)."""
    data = marshal.dumps(body)
    return _HEADER.pack(kind, len(data)) + data


class FrameDecoder:
    """Reassembles messages from a byte stream that may split or merge frames anywhere."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[Message]:
        buffer = self._pending + data if self._pending else data
        messages = []
        start, end = 0, len(buffer)
        while end - start >= _HEADER.size:
            code, length = _HEADER.unpack_from(buffer, start)
            body = start + _HEADER.size
            if end - body < length:
                break
            messages.append((_KINDS[code], marshal.loads(buffer[body:body + length])))
            start = body + length
        self._pending = buffer[start:]
        return messages


class BlockingChannel:
    """The worker's end: buffered blocking receive; sends are locked so model threads may log concurrently."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()

    def send(self, frame: bytes) -> None:
        """Send one frame made by ``encode``."""
        with self._send_lock:
            self._sock.sendall(frame)

    def receive(self) -> Message | None:
        """The next message, or None once the server closed its end."""
        header = self._reader.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        code, length = _HEADER.unpack(header)
        body = self._reader.read(length)
        if len(body) < length:
            return None
        return _KINDS[code], marshal.loads(body)
