"""The server <-> worker wire: length-prefixed pickled tuples over a Unix socket pair, and their kinds."""
from __future__ import annotations

import pickle
import socket
import struct
import threading
from typing import Any

# Only small metadata travels here; tensor bytes travel through the shared-memory arenas (arena.py).
Message = tuple[Any, ...]
_HEADER = struct.Struct("<I")

# server -> worker
INIT = "init"  # (INIT, init dict)
EXECUTE = "execute"  # (EXECUTE, new input arena name or None, [request dict, ...])
GROWN = "grown"  # (GROWN, new output arena name or None, error text or None)
FINALIZE = "finalize"  # (FINALIZE,)
# worker -> server
STARTED = "started"  # (STARTED,): the process is up and waits for INIT
READY = "ready"  # (READY,)
FAILED = "failed"  # (FAILED, message, traceback text)
RESULT = "result"  # (RESULT, batch error or None, [response tuple, ...] or None); the server swaps in responses
GROW = "grow"  # (GROW, bytes needed in the output arena)
LOG = "log"  # (LOG, level name, line)
FINALIZED = "finalized"  # (FINALIZED,)


def encode(message: Message) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Reassembles messages from a byte stream that may split or merge frames anywhere."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        messages = []
        start, end = 0, len(self._buffer)
        while end - start >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buffer, start)
            if end - start - _HEADER.size < length:
                break
            body = start + _HEADER.size
            messages.append(pickle.loads(self._buffer[body:body + length]))
            start = body + length
        del self._buffer[:start]
        return messages


class BlockingChannel:
    """The worker's end: blocking receive; sends are locked so model threads may log concurrently."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()

    def send(self, message: Message) -> None:
        frame = encode(message)
        with self._send_lock:
            self._sock.sendall(frame)

    def receive(self) -> Message | None:
        """The next message, or None once the server closed its end."""
        header = self._read_exactly(_HEADER.size)
        if header is None:
            return None
        (length,) = _HEADER.unpack(header)
        body = self._read_exactly(length)
        return None if body is None else pickle.loads(body)

    def _read_exactly(self, count: int) -> bytearray | None:
        buffer = bytearray(count)
        view = memoryview(buffer)
        received = 0
        while received < count:
            got = self._sock.recv_into(view[received:])
            if got == 0:
                return None
            received += got
        return buffer
