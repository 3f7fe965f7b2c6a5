"""The server <-> worker wire over a Unix socket pair: frames of a fixed binary header and a marshal body.

A frame is ``<kind: u8><body length: u32 LE>`` and then the body: plain values (None, bool, int, float, str,
tuple, list, dict, bytes) in ``marshal`` format, which is fast and needs no pickle; both ends run the same
interpreter, as marshal's format requires. Tensor bytes of small batches travel inside EXECUTE and RESULT frames,
laid out as in the arenas; larger ones travel through the shared-memory arenas (arena.py).
"""
from __future__ import annotations

import itertools
import marshal
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from enum import IntEnum
from typing import Any, TypeVar

from triton_serve.worker import ContentMeta, PollWindow

from .idle_polling import STARVED_S, IdlePriority

_HEADER = struct.Struct("<BI")
_RECEIVE_SIZE = 65536  # bytes asked of each recv: a whole frame of a small batch, and any that follow it
_T = TypeVar("_T")


class Kind(IntEnum):
    """What a frame carries; the comment gives its body."""

    # server -> worker
    INIT = 1  # init dict: model_file, outputs, args, content_types, input_arena, output_arena
    EXECUTE = 2  # (new input arena name or None, [RequestTuple, ...], [request key, ...], inputs' bytes or None,
    #              seconds to poll for the next frame after answering)
    GROWN = 3  # (new output arena name or None, error text or None)
    FINALIZE = 4  # None
    # worker -> server
    STARTED = 5  # None: the process is up and waits for INIT
    READY = 6  # whether the model defines is_ready()
    FAILED = 7  # (message, traceback text)
    # (BatchError or None, [ResponseContent's metadata or None, ...] or None, outputs' bytes or None,
    # (start ns, end ns) or None); a response None: answered through a sender; bytes None: the outputs are in the
    # output arena
    RESULT = 8
    GROW = 9  # bytes needed in the output arena
    LOG = 10  # (level name, line)
    FINALIZED = 11  # None
    CALL = 12  # (call id, method name, argument tuple): run a server_calls.py method; the server answers REPLY
    NOTIFY = 13  # (method name, argument tuple): the same without an answer
    # server -> worker
    REPLY = 14  # (call id, result, None) or (call id, None, (error message, status code name))
    PART = 15  # (call id, item): one item of a streaming call's result, before its REPLY
    # worker -> server
    RESPONSE = 16  # (request key, InlineContent or None, final): a response sender's response
    # server -> worker
    IS_READY = 17  # None: run the model's is_ready() (Triton's user-defined readiness check)
    # worker -> server
    READINESS = 18  # (ready, error text or None): what is_ready() returned, or why it failed


_KINDS = {kind.value: kind for kind in Kind}  # a dict lookup is several times faster than Kind(code)
_REPLY = Kind.REPLY  # on the receive path, a global is faster than the enum's attribute
_PART = Kind.PART
Message = tuple[Kind, Any]  # (kind, body)
# One request of an EXECUTE: (its RequestContent's metadata (triton_serve.worker.encode_content), correlation id,
# flags, timeout in µs).
RequestTuple = tuple[ContentMeta, int | str, int, int]
# A batch that failed as a whole: (message, status code name, traceback text or None).
BatchError = tuple[str, str, str | None]
# A request or response that travels inside the frame: its content's metadata and its tensors' bytes (inline.py).
InlineContent = tuple[ContentMeta, bytes | bytearray]


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


class CallFailed(Exception):
    """The server answered a CALL with an error: its message and status code name ("INVALID_ARG")."""

    def __init__(self, message: str, code_name: str) -> None:
        super().__init__(message)
        self.message = message
        self.code_name = code_name


class BlockingChannel:
    """The worker's end. Any thread may ``send``, ``call`` the server or ``notify`` it; the serving loop
    ``receive``s every message that is not a REPLY.

    Whichever waiting thread finds nobody reading reads the next frame and files it: a REPLY for the thread
    that called, anything else for ``receive``. So the serving loop reads its own frames, with no hand-off
    between threads and no lock beyond the reader's, and a call from the thread that runs ``execute`` reads
    its own reply.
    """

    def __init__(self, sock: socket.socket, idle_priority: IdlePriority | None = None) -> None:
        self._sock = sock
        self.poll_next_s = 0.0  # the most the next read may poll the socket before it sleeps (then 0 again)
        self._idle_priority = idle_priority or IdlePriority(False)  # the priority polls run at
        self._next_batch = PollWindow(0.0)  # learns the wait of those reads for their bytes (_recv_polling)
        self._buffered = b""  # bytes read from the socket past the last whole frame (only the reader touches it)
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()  # held by the thread reading a frame
        self._filed = threading.Condition(threading.Lock())  # threads wait on it while another one reads
        self._waiting = 0
        self._closed = False
        self._inbox: deque[Message] = deque()
        self._replies: dict[int, tuple[Any, tuple[str, str] | None]] = {}
        self._parts: dict[int, deque[Any]] = {}  # items of streaming calls, by call id
        self._call_ids = itertools.count(1)
        self._deferred: deque[bytes] = deque()  # frames from notify_soon, sent before the next frame

    def send(self, frame: bytes) -> None:
        """Send one frame made by ``encode`` (after any that ``notify_soon`` left)."""
        with self._send_lock:
            if self._deferred:
                frame = self._take_deferred() + frame
            self._sock.sendall(frame)

    def _take_deferred(self) -> bytes:
        frames = []
        while self._deferred:
            frames.append(self._deferred.popleft())
        return b"".join(frames)

    def receive(self) -> Message | None:
        """The next message that is not a REPLY, or None once the server closed its end."""
        if not self._inbox and not self._closed and self._read_lock.acquire(False):
            try:  # the serving loop's usual case: nothing filed, nobody reading
                message = self._read()
                if message is not None and message[0] is not _REPLY and message[0] is not _PART:
                    return message
                self._file(message)
            finally:
                self._read_lock.release()
                if self._waiting:
                    with self._filed:
                        self._filed.notify_all()
        return self._wait(lambda: self._inbox.popleft() if self._inbox else None)

    def call(self, method: str, *args: Any) -> Any:
        """Run ``method(*args)`` on the server and return its result; raise CallFailed with the server's error,
        or ConnectionError if the server closed the connection first."""
        call_id = next(self._call_ids)
        self.send(encode(Kind.CALL, (call_id, method, args)))
        answer = self._wait(lambda: self._replies.pop(call_id, None))
        if answer is None:
            raise ConnectionError("the server closed the connection")
        result, error = answer
        if error is not None:
            raise CallFailed(*error)
        return result

    def call_stream(self, method: str, *args: Any) -> Iterator[Any]:
        """Run the streaming ``method(*args)`` on the server and yield each item it sends as it comes; raise
        CallFailed with the server's error, or ConnectionError if the server closed the connection first."""
        call_id = next(self._call_ids)
        parts: deque[Any] = deque()
        self._parts[call_id] = parts

        def take() -> tuple[Kind, Any] | None:
            if parts:
                return _PART, parts.popleft()
            answer = self._replies.pop(call_id, None)
            return None if answer is None else (_REPLY, answer)

        try:
            self.send(encode(Kind.CALL, (call_id, method, args)))
            while True:
                found = self._wait(take)
                if found is None:
                    raise ConnectionError("the server closed the connection")
                kind, value = found
                if kind is _PART:
                    yield value
                    continue
                if value[1] is not None:
                    raise CallFailed(*value[1])
                return
        finally:
            del self._parts[call_id]

    def notify(self, method: str, *args: Any) -> None:
        """Run ``method(*args)`` on the server without waiting; the server logs a failure."""
        self.send(encode(Kind.NOTIFY, (method, args)))

    def notify_soon(self, method: str, *args: Any) -> None:
        """``notify`` from where no lock may be taken (a finalizer, which the garbage collector may run inside
        ``send``): the message goes out just before the next frame the worker sends."""
        self._deferred.append(encode(Kind.NOTIFY, (method, args)))

    def _wait(self, take: Callable[[], _T | None]) -> _T | None:
        """What ``take`` finds among the filed messages, reading frames (or waiting while another thread reads
        them) until it finds something or the connection closes."""
        while True:
            found = take()
            if found is not None or self._closed:
                return found
            if self._read_lock.acquire(False):
                try:
                    found = take()  # filed by the thread that read before
                    if found is not None:
                        return found
                    self._file(self._read())
                finally:
                    self._read_lock.release()
                    if self._waiting:
                        with self._filed:
                            self._filed.notify_all()
                continue
            with self._filed:
                self._waiting += 1
                try:
                    while True:
                        found = take()
                        if found is not None or self._closed:
                            return found
                        if not self._read_lock.locked():
                            break
                        self._filed.wait()
                finally:
                    self._waiting -= 1

    def _file(self, message: Message | None) -> None:
        if message is None:
            self._closed = True
        elif message[0] is _REPLY:
            call_id, result, error = message[1]
            self._replies[call_id] = (result, error)
        elif message[0] is _PART:
            call_id, item = message[1]
            parts = self._parts.get(call_id)
            if parts is not None:  # None: the caller stopped reading
                parts.append(item)
        else:
            self._inbox.append(message)

    def _read(self) -> Message | None:
        """The next frame's message, or None once the server closed its end. A whole frame usually comes in one
        ``recv`` (cheaper than a buffered reader's two reads); a frame split across reads is put together."""
        data = self._buffered
        if not data:  # the usual case: nothing left from the last read, so read without joining
            data = self._recv_polling() if self.poll_next_s else self._sock.recv(_RECEIVE_SIZE)
        if len(data) < _HEADER.size:
            data = self._receive_at_least(data, _HEADER.size)
            if len(data) < _HEADER.size:
                return None
        code, length = _HEADER.unpack_from(data)
        end = _HEADER.size + length
        if len(data) < end:
            data = self._receive_at_least(data, end)
            if len(data) < end:
                return None
        self._buffered = data[end:]
        return _KINDS[code], marshal.loads(memoryview(data)[_HEADER.size:end])

    def _recv_polling(self) -> bytes:
        """The next bytes, polled for without sleeping (waking a sleeping process costs tens of µs on a virtual
        machine whose idle CPUs halt), then waited for. How long: four times the usual wait of these reads, at most
        ``poll_next_s`` (``PollWindow``); where the bytes usually come later, the server is busy with other work,
        and polling would take a CPU it needs. Polls run at idle priority where they can (``idle_polling``)."""
        start = time.perf_counter()
        learnt = self._next_batch
        learnt.limit_s, self.poll_next_s = self.poll_next_s, 0.0
        window = learnt.seconds
        data = None
        if window:
            deadline = start + window
            idle = self._idle_priority.enter(start)
            last = now = start
            try:
                while data is None and now < deadline:
                    last, now = now, time.perf_counter()
                    try:
                        data = self._sock.recv(_RECEIVE_SIZE, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        continue
            finally:
                if idle:  # starved: the batch came while the poller was off its CPU, and may have waited as long
                    self._idle_priority.leave(starved=None if data is None else now - last > STARVED_S, now=now)
        if data is None:
            data = self._sock.recv(_RECEIVE_SIZE)
        learnt.learn(time.perf_counter() - start)
        return data

    def _receive_at_least(self, data: bytes, size: int) -> bytes:
        """``data`` and what the socket sends next: ``size`` bytes or more, fewer if the connection ends first."""
        chunks = [data] if data else []  # (a join of one chunk is that chunk, not a copy)
        have = len(data)
        while have < size:
            chunk = self._sock.recv(max(size - have, _RECEIVE_SIZE))
            if not chunk:
                break
            chunks.append(chunk)
            have += len(chunk)
        return b"".join(chunks)
