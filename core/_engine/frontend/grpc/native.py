"""The native gRPC transport: gRPC calls over h2.H2Connection, dispatched to the same servicers as grpc.aio.

A call is a Stream: its request messages are cut from DATA as they arrive (5-byte prefix, optional
gzip/deflate, decompressed no further than the maximum message size, and no further than what the server's
calls hold inflated at once leaves of it: see ``Call._inflate``); a unary call runs as one task once
the request is complete, a client-streaming call as soon as its HEADERS arrive, reading an async iterator
fed by DATA. A client-streaming call's messages wait in wire form until its handler takes them, and the
client gets flow-control credit back only then; while the call's responses wait for the client to read
them, the handler gets no further requests. The context offers what our servicers and the restriction
check use of grpc.aio.ServicerContext.
"""
from __future__ import annotations

import asyncio
import base64
import gzip
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message_factory import GetMessageClass

from ..busy_poll import BusyPoll
from ...errors import unavailable
from ...protos import grpc_service_pb2, health_pb2
from ..inflate import WBITS, BudgetSpent, InflateBudget, TooLarge, Undecodable
from ..restricted import GrpcRestrictionInterceptor
from . import h2
from .header_block import STATUS_200, literal_header

log = logging.getLogger(__name__)

_HIDDEN = frozenset(("content-type", "te", "grpc-encoding", "grpc-accept-encoding", "grpc-timeout"))
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_ZLIB_LEVELS = {"low": 1, "medium": 6, "high": 9}


class _Method:
    __slots__ = ("handler", "request_type", "client_streaming", "server_streaming", "path")

    def __init__(self, path: str, handler: Callable[..., Any], request_type: Any, client_streaming: bool,
                 server_streaming: bool) -> None:
        self.path = path
        self.handler = handler
        self.request_type = request_type
        self.client_streaming = client_streaming
        self.server_streaming = server_streaming


def method_table(servicers: Sequence[tuple[Any, Any]]) -> dict[str, _Method]:
    """``/package.Service/Method`` → handler, from each (service descriptor, servicer) pair."""
    table = {}
    for service, servicer in servicers:
        for method in service.methods:
            path = f"/{service.full_name}/{method.name}"
            table[path] = _Method(path, getattr(servicer, method.name), GetMessageClass(method.input_type),
                                  method.client_streaming, method.server_streaming)
    return table


def default_services(inference: Any, health: Any) -> list[tuple[Any, Any]]:
    return [(grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"], inference),
            (health_pb2.DESCRIPTOR.services_by_name["Health"], health)]


def _percent_encode(message: str) -> bytes:
    raw = message.encode()
    if all(0x20 <= byte <= 0x7E and byte != 0x25 for byte in raw):
        return raw
    return b"".join(bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte
                    for byte in raw)


def _parse_timeout(value: str) -> float | None:
    if len(value) < 2 or len(value) > 9 or not value[:-1].isdigit() or value[-1] not in _TIMEOUT_UNITS:
        return None
    return int(value[:-1]) * _TIMEOUT_UNITS[value[-1]]


_RESPONSE_HEAD = STATUS_200 + literal_header(b"content-type", b"application/grpc")
_RESPONSE_HEAD_GZIP = _RESPONSE_HEAD + literal_header(b"grpc-encoding", b"gzip")


def _headers_frame(stream_id: int, block: bytes, end: bool, max_frame: int) -> bytes:
    flags = h2.FLAG_END_STREAM if end else 0
    if len(block) <= max_frame:
        return h2.frame(h2.HEADERS, flags | h2.FLAG_END_HEADERS, stream_id, block)
    parts = [block[i:i + max_frame] for i in range(0, len(block), max_frame)]
    out = [h2.frame(h2.HEADERS, flags, stream_id, parts[0])]
    for index, part in enumerate(parts[1:], 1):
        out.append(h2.frame(h2.CONTINUATION, h2.FLAG_END_HEADERS if index == len(parts) - 1 else 0,
                            stream_id, part))
    return b"".join(out)


def _trailer_block(code: grpc.StatusCode, details: str, trailing: Sequence[tuple[str, Any]] = ()) -> bytes:
    block = literal_header(b"grpc-status", str(code.value[0]).encode())
    if details:
        block += literal_header(b"grpc-message", _percent_encode(details))
    for key, value in trailing:
        if key.endswith("-bin") and isinstance(value, bytes):
            value = base64.b64encode(value).rstrip(b"=")
        block += literal_header(key.encode(), value if isinstance(value, bytes) else str(value).encode())
    return block


class _Finished(Exception):
    """The call already ended (deadline, abort): nothing more to send."""


class NativeContext:
    """The part of grpc.aio.ServicerContext our servicers use."""

    def __init__(self, peer: str, metadata: tuple[tuple[str, str | bytes], ...], deadline: float | None) -> None:
        self._peer = peer
        self._metadata = metadata
        self._deadline = deadline
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailing: Sequence[tuple[str, Any]] = ()
        self._callbacks: list[Callable[[Any], None]] = []
        self._done = False
        self._cancelled = False
        self._call: Call | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self._code, self._details = code, details
        if trailing_metadata:
            self._trailing = tuple(trailing_metadata)
        raise grpc.aio.AbortError()

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def set_trailing_metadata(self, trailing_metadata: Any) -> None:
        self._trailing = tuple(trailing_metadata)

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._done

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def peer(self) -> str:
        return self._peer

    def set_compression(self, compression: Any) -> None:
        """Ignored, as grpc.aio ignores it (the level is server-wide)."""

    def release_message(self, message: Any) -> None:
        """The handler is done with ``message``, one request of a client-streaming call: what it held inflated
        is given back (a unary call's message is given back when its call ends). Not in grpc.aio."""
        if self._call is not None:
            self._call.give_back(message)

    def _finish(self) -> None:
        self._done = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("gRPC done callback failed")


class _Requests:
    """The request iterator of a client-streaming call: messages in wire form, decoded as the handler takes
    them. The client's credit for them comes back once the handler has taken every complete message; while
    the call's responses wait for the client to read, the handler gets no further request."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.messages: deque[tuple[int, bytes]] = deque()
        self.ended = False
        self._waiter: asyncio.Future[None] | None = None

    def push(self, flag: int, payload: bytes) -> None:
        self.messages.append((flag, payload))
        self.wake()

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._waiter = None

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> Any:
        call = self.call
        await call.drain()
        while not self.messages or call.ended:
            if self.ended or call.ended:
                raise StopAsyncIteration
            self._waiter = call.connection.loop.create_future()
            await self._waiter
        flag, payload = self.messages.popleft()
        if not self.messages:
            call.connection.consumed(call, call.recv_held)
        message = call.decode(flag, payload)
        if message is None:  # the call has ended with the reason
            raise asyncio.CancelledError()
        return message


class Call(h2.Stream):
    """One gRPC call on one HTTP/2 stream."""

    __slots__ = ("server", "method", "context", "task", "buffer", "encoding", "compress", "requests",
                 "request", "head_sent", "ended", "timer", "inflated")

    def __init__(self, server: NativeServer, connection: h2.H2Connection, stream_id: int, method: _Method,
                 metadata: tuple[tuple[str, str | bytes], ...], encoding: str, compress: bool,
                 timeout: float | None) -> None:
        super().__init__(connection, stream_id)
        self.server = server
        self.method = method
        deadline = None if timeout is None else time.monotonic() + timeout
        self.context = NativeContext(connection.peer, metadata, deadline)
        self.task: asyncio.Task[None] | None = None
        self.buffer = bytearray()
        self.encoding = encoding
        self.compress = compress
        self.requests: _Requests | None = _Requests(self) if method.client_streaming else None
        self.request: tuple[int, bytes] | None = None  # a unary call's message, in wire form
        self.head_sent = False
        self.ended = False
        self.timer = None if timeout is None else connection.loop.call_later(timeout, self._deadline_passed)
        self.inflated: dict[int, int] | None = None  # by id() of the messages it holds: their inflated bytes
        if self.requests is not None:
            self.context._call = self
            self._start(self.requests)

    # ---- receiving ----

    def data_received(self, data: bytes, end_stream: bool) -> None:
        connection = self.connection
        if self.ended:
            connection.consumed(self, len(data))
            return
        buffer = self.buffer
        buffer += data
        offset, size = 0, len(buffer)
        while size - offset >= 5:
            flag = buffer[offset]
            length = int.from_bytes(buffer[offset + 1:offset + 5], "big")
            if length > self.server.max_message_size:
                self.fail(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"Received message larger than max ({length} vs. {self.server.max_message_size})")
                return
            if size - offset - 5 < length:
                if self.requests is None or not self.requests.messages:  # the handler waits for this message
                    connection.want(self, 5 + length - (size - offset))
                break
            payload = bytes(buffer[offset + 5:offset + 5 + length])
            offset += 5 + length
            if self.requests is not None:
                self.requests.push(flag, payload)
            elif self.request is not None:
                self.fail(grpc.StatusCode.UNIMPLEMENTED, "Too many requests for a unary call")  # grpcio's wording
                return
            else:
                self.request = (flag, payload)
        if offset:
            del buffer[:offset]
        if self.requests is None or not self.requests.messages:  # the handler waits for these bytes
            connection.consumed(self, self.recv_held)

    def decode(self, flag: int, payload: bytes) -> Any:
        """The request message from its wire form; None once the call has failed with the reason."""
        inflated = 0
        if flag:
            payload = self._inflate(payload)
            if self.ended:
                return None
            inflated = len(payload)
        try:
            message = self.method.request_type.FromString(payload)
        except Exception:
            self.server.inflate_budget.give_back(inflated)
            self.fail(grpc.StatusCode.INTERNAL, "Exception deserializing request!")
            return None
        if inflated:
            if self.inflated is None:
                self.inflated = {}
            key = id(message)  # added to: a message dropped unreleased may have left its id to this one
            self.inflated[key] = self.inflated.get(key, 0) + inflated
        return message

    def _inflate(self, payload: bytes) -> bytes:
        """``payload`` inflated and counted as held by the server until ``give_back``: within the maximum message
        size, and within what the messages other calls hold inflated leave of it (``InflateBudget``). A message
        past either fails its call."""
        wbits = WBITS.get(self.encoding)
        if wbits is None:
            self.fail(grpc.StatusCode.INTERNAL, "Compressed message without grpc-encoding")
            return b""
        try:
            return self.server.inflate_budget.inflate(payload, wbits)
        except Undecodable as error:
            self.fail(grpc.StatusCode.INTERNAL, f"Failed to decompress the message: {error}")
        except TooLarge:
            self.fail(grpc.StatusCode.RESOURCE_EXHAUSTED, "Decompressed message larger than max")  # grpcio's words
        except BudgetSpent:
            self.fail(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"Decompressed messages in flight would exceed the server's limit "
                      f"({self.server.max_message_size} bytes); retry when fewer are in flight")
        return b""

    def give_back(self, message: Any = None) -> None:
        """Give the server back the inflated bytes of ``message``, or of every message the call holds."""
        held = self.inflated
        if held:
            budget = self.server.inflate_budget
            if message is None:
                budget.give_back(sum(held.values()))
                held.clear()
            else:
                budget.give_back(held.pop(id(message), 0))

    def end_received(self) -> None:
        if self.ended:
            return
        if self.buffer:
            self.fail(grpc.StatusCode.INTERNAL, "Incomplete message at the end of the stream")
            return
        if self.requests is not None:
            self.requests.ended = True
            self.requests.wake()
        elif self.request is None:
            self.fail(grpc.StatusCode.INTERNAL, "No request message for a unary call")
        else:
            message = self.decode(*self.request)
            self.request = None
            if message is not None:
                self._start(message)

    def reset(self, code: int) -> None:
        """The client cancelled the call (RST_STREAM) or the connection went away."""
        self.context._cancelled = True
        self._stop_timer()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if not self.ended:
            self.ended = True
            self.context._finish()
            self.give_back()
        if self.requests is not None:
            self.requests.wake()

    # ---- running ----

    def _start(self, request: Any) -> None:
        self.task = self.connection.loop.create_task(self._run(request))
        self.server.tasks.add(self.task)
        self.task.add_done_callback(self._ran)

    def _ran(self, task: asyncio.Task[None]) -> None:
        self.server.tasks.discard(task)
        self.task = None  # the task's coroutine refers to this call: without the cycle, the call is freed at once
        self.context._call = None  # a streaming call's context refers to it: no cycle left to collect

    async def _run(self, request: Any) -> None:
        method, context = self.method, self.context
        code, details = grpc.StatusCode.OK, ""
        try:
            if method.server_streaming:
                async for response in method.handler(request, context):
                    if self.ended:
                        break
                    self.send_message(response)
                    await self.drain()
            else:
                response = await method.handler(request, context)
                if response is not None and not self.ended:
                    self.send_message(response, end_code=context._code or grpc.StatusCode.OK,
                                      end_details=context._details)
                    return
                if response is None and context._code is None:
                    code, details = grpc.StatusCode.UNKNOWN, "Unexpected: handler returned no response"
            if context._code is not None:
                code, details = context._code, context._details
        except grpc.aio.AbortError:
            code, details = context._code or grpc.StatusCode.UNKNOWN, context._details
        except asyncio.CancelledError:
            return  # reset by the client, or the deadline passed and its status is already sent
        except _Finished:
            return
        except Exception as error:
            log.exception("gRPC %s failed", method.path)
            code, details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(error)}: {error}"
        finally:
            self._stop_timer()
        self.end(code, details)

    def send_message(self, message: Any, end_code: grpc.StatusCode | None = None, end_details: str = "") -> None:
        """One response message; with ``end_code`` the trailers follow in the same write."""
        payload = message.SerializeToString()
        if len(payload) > self.server.max_message_size:
            self.end(grpc.StatusCode.RESOURCE_EXHAUSTED,
                     f"Sent message larger than max ({len(payload)} vs. {self.server.max_message_size})")
            raise _Finished()
        flag = 0
        if self.compress:
            payload = gzip.compress(payload, self.server.compress_level)
            flag = 1
        connection = self.connection
        head = b""
        if not self.head_sent:
            self.head_sent = True
            block = _RESPONSE_HEAD_GZIP if self.compress else _RESPONSE_HEAD
            head = _headers_frame(self.stream_id, block, False, connection.peer_max_frame)
        body = bytes((flag,)) + len(payload).to_bytes(4, "big") + payload
        tail = b""
        if end_code is not None:
            self.ended = True
            tail = _headers_frame(self.stream_id, _trailer_block(end_code, end_details, self.context._trailing),
                                  True, connection.peer_max_frame)
        connection.send(self, head, body, tail, end_code is not None)
        if end_code is not None:
            self._over()

    def end(self, code: grpc.StatusCode, details: str) -> None:
        """Trailers (trailers-only when nothing was sent) with ``code``; the call is over."""
        if self.ended:
            return
        self.ended = True
        block = _trailer_block(code, details, self.context._trailing)
        if not self.head_sent:
            self.head_sent = True
            block = _RESPONSE_HEAD + block
        self.connection.send(self, b"", b"", _headers_frame(self.stream_id, block, True,
                                                             self.connection.peer_max_frame), True)
        self._over()

    def _over(self) -> None:
        """The call has sent its status: its handler is returning or being cancelled and holds none of its messages
        once it has, so their inflated bytes are given back now."""
        self.context._finish()
        self.give_back()
        if self.server.busy_poll is not None:
            self.server.busy_poll.answered()

    def fail(self, code: grpc.StatusCode, details: str) -> None:
        """End the call from the transport's side: cancel its handler, send the status."""
        self._stop_timer()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.end(code, details)
        if self.requests is not None:
            self.requests.wake()

    def _deadline_passed(self) -> None:
        self.timer = None
        self.context._cancelled = True
        self.fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class NativeServer:
    """Accepts connections and opens a Call per gRPC request stream."""

    def __init__(self, methods: dict[str, _Method], max_message_size: int, compression_level: str,
                 interceptors: Sequence[Any], keepalive_time_ms: int, keepalive_timeout_ms: int,
                 max_connection_age_ms: int | None, max_connection_age_grace_ms: int | None,
                 ping_policy: h2.PingPolicy = h2.PingPolicy(), busy_poll: BusyPoll | None = None) -> None:
        self.methods = methods
        self.max_message_size = max_message_size
        self.compress_level = _ZLIB_LEVELS.get(compression_level, 0)
        self.restrictions = [i for i in interceptors if isinstance(i, GrpcRestrictionInterceptor)]
        if len(self.restrictions) != len(interceptors):
            raise unavailable("the native gRPC transport supports only the restriction interceptor")
        self.keepalive_time = keepalive_time_ms / 1000
        self.keepalive_timeout = keepalive_timeout_ms / 1000
        self.max_age = None if max_connection_age_ms is None else max_connection_age_ms / 1000
        self.max_age_grace = None if max_connection_age_grace_ms is None else max_connection_age_grace_ms / 1000
        self.ping_policy = ping_policy
        self.busy_poll = busy_poll  # told of every call's start and end
        self.inflate_budget = InflateBudget(max_message_size)  # compressed messages held inflated (Call._inflate)
        self.connections: set[h2.H2Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.AbstractServer | None = None

    def protocol(self) -> h2.H2Connection:
        connection = h2.H2Connection(self.open_stream, self.connections.discard, self.keepalive_time,
                                     self.keepalive_timeout, self.ping_policy)
        self.connections.add(connection)
        if self.max_age is not None:
            loop = connection.loop
            loop.call_later(self.max_age, self._too_old, connection)
        return connection

    def _too_old(self, connection: h2.H2Connection) -> None:
        if connection.transport is None:
            return
        connection.goaway(h2.NO_ERROR, "max_age")
        if self.max_age_grace is not None:
            connection.loop.call_later(self.max_age_grace, connection.abort)

    async def start(self, host: str, port: int, reuse_port: bool, tls: ssl.SSLContext | None = None) -> None:
        """Listen; with ``tls``, every connection is TLS (its context should offer ALPN "h2")."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self.protocol, host=host, port=port, reuse_port=reuse_port or None,
                                               family=socket.AF_UNSPEC, backlog=1024, ssl=tls)

    async def stop(self, grace: float) -> None:
        if self.server is not None:
            self.server.close()
        for connection in list(self.connections):
            connection.goaway(h2.NO_ERROR, "server shutting down")
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=grace)
        for task in list(self.tasks):
            task.cancel()
        for connection in list(self.connections):
            connection.abort()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=1.0)
        for _ in range(3):  # let the aborted transports run connection_lost before the loop may close
            await asyncio.sleep(0)
        if self.server is not None:
            await asyncio.wait_for(self.server.wait_closed(), timeout=1.0)

    def open_stream(self, connection: h2.H2Connection, stream_id: int, headers: list[tuple[str, str]],
                    end_stream: bool) -> h2.Stream | None:
        if self.busy_poll is not None:
            self.busy_poll.arrived()
        path = method = content_type = ""
        encoding, accept, timeout_text = "identity", "", ""
        metadata: list[tuple[str, str | bytes]] = []
        for key, value in headers:
            if key[0] == ":":
                if key == ":path":
                    path = value
                elif key == ":method":
                    method = value
            elif key == "content-type":
                content_type = value
            elif key == "grpc-encoding":
                encoding = value
            elif key == "grpc-accept-encoding":
                accept = value
            elif key == "grpc-timeout":
                timeout_text = value
            elif key not in _HIDDEN:
                if key.endswith("-bin"):
                    try:
                        metadata.append((key, base64.b64decode(value + "=" * (-len(value) % 4))))
                    except ValueError:
                        continue
                else:
                    metadata.append((key, value))
        if method != "POST" or not content_type.startswith("application/grpc"):
            connection.write(_headers_frame(stream_id, b"\x8d" if method != "POST" else  # 404 / 415
                                            b"\x08\x03415", True, connection.peer_max_frame))
            connection.reset_stream(h2.Stream(connection, stream_id), h2.NO_ERROR)
            return None
        target = self.methods.get(path)
        timeout = _parse_timeout(timeout_text) if timeout_text else None
        if target is None:
            return self._refuse(connection, stream_id, end_stream, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        if encoding not in ("identity", "gzip", "deflate"):
            return self._refuse(connection, stream_id, end_stream, grpc.StatusCode.UNIMPLEMENTED,
                                f"Invalid compression algorithm: '{encoding}'")
        compress = bool(self.compress_level) and "gzip" in accept.replace(" ", "").split(",")
        for restriction in self.restrictions:
            refusal = restriction.refusal(path, metadata)
            if refusal is not None:
                return self._refuse(connection, stream_id, end_stream, grpc.StatusCode.UNAVAILABLE, refusal)
        return Call(self, connection, stream_id, target, tuple(metadata), encoding, compress, timeout)

    @staticmethod
    def _refuse(connection: h2.H2Connection, stream_id: int, end_stream: bool, code: grpc.StatusCode,
                details: str) -> None:
        """A trailers-only response before the call starts; the rest of the request is discarded."""
        block = _RESPONSE_HEAD + _trailer_block(code, details)
        out = _headers_frame(stream_id, block, True, connection.peer_max_frame)
        if not end_stream:
            out += h2.frame(h2.RST_STREAM, 0, stream_id, b"\x00\x00\x00\x00")
        connection.write(out)
        return None

