"""The server side of an HTTP/2 connection (RFC 9113) on an asyncio protocol, as much as gRPC needs.

Frames are parsed in place from one receive buffer with struct offsets; each stream's events go to a
``Stream`` that the connection's ``open_stream`` callback creates for a request's HEADERS. Sending is
flow controlled per stream and per connection: what the peer's windows do not admit waits in the stream
until WINDOW_UPDATE gives credit, or the connection goes away.
"""
from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable

import hpack

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 1, 2, 3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 4, 5, 6

# (length << 8 | type), flags, stream id: the 9-byte frame header in one pack
_FRAME = struct.Struct(">IBI")
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_GOAWAY = struct.Struct(">II")

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
OUR_WINDOW = 16 * 1024 * 1024  # each stream's and the connection's receive window
OUR_MAX_FRAME = 16_384  # what we accept (the protocol's default, which every client respects)
MAX_CONCURRENT_STREAMS = 1024


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _FRAME.pack(len(payload) << 8 | kind, flags, stream_id) + payload


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal_header(name: bytes, value: bytes) -> bytes:
    """One header as an HPACK literal without indexing, new name, no Huffman coding."""
    return b"\x00" + _hpack_int(len(name), 7, 0) + name + _hpack_int(len(value), 7, 0) + value


STATUS_200 = b"\x88"  # :status 200, index 8 of the static table


class HeaderDecoder:
    """hpack's decoder, remembering the headers of blocks made only of indexed fields. Such a block leaves the
    dynamic table as it is, so it means the same headers until a block that changes the table comes; a gRPC client
    sends the same block for every call on a connection once its headers are in the table, and hpack's pure-Python
    decoding of it is the largest cost of a small call."""

    KEPT = 64  # blocks remembered per connection

    def __init__(self) -> None:
        self._decoder = hpack.Decoder()
        self._known: dict[bytes, list[tuple[str, str]]] = {}

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        """The block's (name, value) pairs; the list is shared between calls with the same block: do not change it."""
        pairs = self._known.get(block)
        if pairs is not None:
            return pairs
        pairs = [(str(name), str(value)) for name, value in self._decoder.decode(block)]
        if not _only_indexed(block):
            self._known.clear()  # the table may have changed: an index may now mean another header
        elif len(self._known) < self.KEPT:
            self._known[block] = pairs
        return pairs


def _only_indexed(block: bytes) -> bool:
    """Whether every field of a (well-formed) header block is an indexed field (RFC 7541 6.1)."""
    at, end = 0, len(block)
    while at < end:
        first = block[at]
        if not first & 0x80:
            return False
        at += 1
        if first & 0x7F == 0x7F:  # the index goes on in bytes whose high bit says another follows
            while block[at] & 0x80:
                at += 1
            at += 1
    return True


class ConnectionError_(Exception):
    """A connection error: the connection ends with GOAWAY and this code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Stream:
    """One request stream; the connection calls these on the event loop."""

    __slots__ = ("connection", "stream_id", "send_window", "pending", "pending_end", "remote_closed",
                 "closed", "_drained", "recv_unacked")

    def __init__(self, connection: H2Connection, stream_id: int) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.send_window = connection.peer_initial_window
        self.pending: list[bytes | memoryview] = []  # encoded frames, or DATA payloads awaiting credit (see H2Connection)
        self.pending_end = False
        self.remote_closed = False
        self.closed = False
        self._drained: asyncio.Future[None] | None = None
        self.recv_unacked = 0

    def data_received(self, data: bytes, end_stream: bool) -> None:
        raise NotImplementedError

    def end_received(self) -> None:
        """The client half-closed the stream (END_STREAM on its HEADERS or DATA)."""

    def reset(self, code: int) -> None:
        """The client reset the stream, or the connection went away."""

    async def drain(self) -> None:
        """Wait until what this stream has sent is out of its queue (flow-control credit came), or the
        stream or connection is gone."""
        if self.pending and not self.closed:
            self._drained = self.connection.loop.create_future()
            await self._drained

    def wake(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None


OpenStream = Callable[["H2Connection", int, list[tuple[str, str]], bool], "Stream | None"]


class H2Connection(asyncio.Protocol):
    """One client connection: frames in, frames out."""

    def __init__(self, open_stream: OpenStream, on_close: Callable[[H2Connection], None],
                 keepalive_time: float | None = None, keepalive_timeout: float = 20.0) -> None:
        self.open_stream = open_stream
        self.on_close = on_close
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.preface_seen = False
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0
        self.decoder = HeaderDecoder()
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16_384
        self.send_window = DEFAULT_WINDOW  # the connection's
        self.recv_unacked = 0
        self.blocked: dict[int, Stream] = {}  # streams with output waiting for credit
        self.header_block: bytearray | None = None  # a HEADERS block awaiting its CONTINUATION frames
        self.header_stream = 0
        self.header_end_stream = False
        self.going_away = False
        self.peer = ""
        self.keepalive_time = keepalive_time
        self.keepalive_timeout = keepalive_timeout
        self._keepalive: asyncio.TimerHandle | None = None
        self._ping_deadline: asyncio.TimerHandle | None = None

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not registered subclasses
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = peer[0]
            self.peer = f"ipv6:[{host}]:{peer[1]}" if ":" in host else f"ipv4:{host}:{peer[1]}"
        settings = b"".join(_SETTING.pack(key, value) for key, value in (
            (SETTINGS_MAX_CONCURRENT_STREAMS, MAX_CONCURRENT_STREAMS), (SETTINGS_INITIAL_WINDOW_SIZE, OUR_WINDOW),
            (SETTINGS_MAX_FRAME_SIZE, OUR_MAX_FRAME), (SETTINGS_ENABLE_PUSH, 0)))
        self.write(frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0, _U32.pack(OUR_WINDOW - DEFAULT_WINDOW)))
        self._arm_keepalive()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for timer in (self._keepalive, self._ping_deadline):
            if timer is not None:
                timer.cancel()
        streams, self.streams = self.streams, {}
        self.blocked.clear()
        for stream in streams.values():
            stream.closed = True
            stream.wake()
            stream.reset(CANCEL)
        self.on_close(self)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        try:
            if not self.preface_seen:
                if len(buffer) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buffer)):
                        raise ConnectionError_(PROTOCOL_ERROR, "invalid connection preface")
                    return
                if buffer[:len(PREFACE)] != PREFACE:
                    raise ConnectionError_(PROTOCOL_ERROR, "invalid connection preface")
                self.preface_seen = True
                del buffer[:len(PREFACE)]
            offset = self._frames(buffer)
            if offset:
                del buffer[:offset]
            self._return_credit()
        except ConnectionError_ as error:
            self.close_with(error.code, str(error))
        except Exception:  # a bug must end this connection only
            log.exception("HTTP/2 connection failed")
            self.close_with(INTERNAL_ERROR, "internal error")

    # ---- receiving ----

    def _frames(self, buffer: bytearray) -> int:
        view = memoryview(buffer)
        offset, size = 0, len(buffer)
        try:
            while size - offset >= 9:
                length_kind, flags, stream_id = _FRAME.unpack_from(buffer, offset)
                length, kind, stream_id = length_kind >> 8, length_kind & 0xFF, stream_id & 0x7FFFFFFF
                if length > OUR_MAX_FRAME:
                    raise ConnectionError_(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                end = offset + 9 + length
                if end > size:
                    break
                payload = view[offset + 9:end]
                offset = end
                if self.header_block is not None and kind != CONTINUATION:
                    raise ConnectionError_(PROTOCOL_ERROR, "expected CONTINUATION")
                if kind == DATA:
                    self._data(flags, stream_id, payload)
                elif kind == HEADERS:
                    self._headers(flags, stream_id, payload)
                elif kind == CONTINUATION:
                    self._continuation(flags, stream_id, payload)
                elif kind == SETTINGS:
                    self._settings(flags, stream_id, payload)
                elif kind == WINDOW_UPDATE:
                    self._window_update(stream_id, payload)
                elif kind == PING:
                    self._ping(flags, stream_id, payload)
                elif kind == RST_STREAM:
                    self._rst_stream(stream_id, payload)
                elif kind == GOAWAY:
                    if stream_id:
                        raise ConnectionError_(PROTOCOL_ERROR, "GOAWAY on a stream")
                    self.going_away = True
                elif kind == PRIORITY:
                    if stream_id == 0 or length != 5:
                        raise ConnectionError_(PROTOCOL_ERROR, "malformed PRIORITY")
                elif kind == PUSH_PROMISE:
                    raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
                # unknown frame types are ignored (RFC 9113 §4.1)
                if self.transport is None:
                    break
        finally:
            view.release()
        return offset

    @staticmethod
    def _unpad(flags: int, payload: memoryview) -> memoryview:
        if flags & FLAG_PADDED:
            if not payload:
                raise ConnectionError_(PROTOCOL_ERROR, "padded frame without pad length")
            pad = payload[0]
            if pad >= len(payload):
                raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
            return payload[1:len(payload) - pad]
        return payload

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        self.recv_unacked += len(payload)
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we closed or reset: the connection's credit still comes back
        if stream.remote_closed:
            self._reset_stream(stream_id, STREAM_CLOSED)
            return
        stream.recv_unacked += len(payload)
        body = self._unpad(flags, payload)
        end = bool(flags & FLAG_END_STREAM)
        if end:
            stream.remote_closed = True
        stream.data_received(bytes(body), end)
        if end:
            stream.end_received()

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._unpad(flags, payload)
        if flags & FLAG_PRIORITY:
            if len(block) < 5:
                raise ConnectionError_(PROTOCOL_ERROR, "HEADERS priority fields missing")
            block = block[5:]
        self.header_stream = stream_id
        self.header_end_stream = bool(flags & FLAG_END_STREAM)
        if flags & FLAG_END_HEADERS:
            self._header_block(bytes(block))
        else:
            self.header_block = bytearray(block)

    def _continuation(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if self.header_block is None or stream_id != self.header_stream:
            raise ConnectionError_(PROTOCOL_ERROR, "unexpected CONTINUATION")
        self.header_block += payload
        if len(self.header_block) > 1 << 20:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
        if flags & FLAG_END_HEADERS:
            block, self.header_block = bytes(self.header_block), None
            self._header_block(block)

    def _header_block(self, block: bytes) -> None:
        stream_id, end_stream = self.header_stream, self.header_end_stream
        try:
            headers = self.decoder.decode(block)
        except Exception as error:  # hpack's errors: the decoder's state is lost, so is the connection
            raise ConnectionError_(COMPRESSION_ERROR, f"header block: {error}") from None
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client: gRPC clients send none; they end the stream
            if not end_stream:
                raise ConnectionError_(PROTOCOL_ERROR, "trailers without END_STREAM")
            stream.remote_closed = True
            stream.end_received()
            return
        if stream_id % 2 == 0 or stream_id <= self.last_stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "invalid stream id for a new stream")
        self.last_stream_id = stream_id
        if self.going_away:
            self._reset_stream(stream_id, REFUSED_STREAM)
            return
        if len(self.streams) >= MAX_CONCURRENT_STREAMS:
            self._reset_stream(stream_id, REFUSED_STREAM)
            return
        stream = self.open_stream(self, stream_id, headers, end_stream)
        if stream is None:
            return
        self.streams[stream_id] = stream
        if end_stream:
            stream.remote_closed = True
            stream.end_received()

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & FLAG_ACK:
            if payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                delta, self.peer_initial_window = value - self.peer_initial_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 16_384 <= value <= 16_777_215:
                    raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == SETTINGS_ENABLE_PUSH and value > 1:
                raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
            # HEADER_TABLE_SIZE bounds our encoder's table; we never index, so any size is honoured
        self.write(frame(SETTINGS, FLAG_ACK, 0))
        self._flush_blocked()

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "WINDOW_UPDATE length not 4")
        increment = _U32.unpack_from(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window overflow")
            self._flush_blocked()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if increment == 0:
            self._reset_stream(stream_id, PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._reset_stream(stream_id, FLOW_CONTROL_ERROR)
            return
        if stream.pending:
            self._flush(stream)

    def _ping(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ConnectionError_(FRAME_SIZE_ERROR, "PING length not 8")
        if flags & FLAG_ACK:
            if self._ping_deadline is not None:
                self._ping_deadline.cancel()
                self._ping_deadline = None
                self._arm_keepalive()
            return
        self.write(frame(PING, FLAG_ACK, 0, bytes(payload)))

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "RST_STREAM length not 4")
        if stream_id > self.last_stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            self.blocked.pop(stream_id, None)
            stream.closed = True
            stream.pending.clear()
            stream.wake()
            stream.reset(_U32.unpack_from(payload)[0])

    def _return_credit(self) -> None:
        """WINDOW_UPDATE for what was received, once half a window has been consumed (data is handed to
        the streams as it arrives), so that a large message costs a few frames, not one per DATA frame."""
        out = []
        if self.recv_unacked >= OUR_WINDOW // 2:
            out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.recv_unacked)))
            self.recv_unacked = 0
        for stream in self.streams.values():
            if stream.recv_unacked >= OUR_WINDOW // 2 and not stream.remote_closed:
                out.append(frame(WINDOW_UPDATE, 0, stream.stream_id, _U32.pack(stream.recv_unacked)))
                stream.recv_unacked = 0
        if out:
            self.write(b"".join(out))

    # ---- sending ----

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def send(self, stream: Stream, head: bytes, body: bytes, tail: bytes, end: bool) -> None:
        """Send ``head`` (HEADERS frames, or b""), ``body`` as DATA frames as far as the windows allow,
        then ``tail`` (trailing HEADERS frames, or b""); ``end`` closes our side. What does not fit waits
        for WINDOW_UPDATE in the stream. One transport write when everything fits."""
        if stream.closed:
            return
        if stream.pending:  # earlier output still waits for credit: keep the order
            if head:
                stream.pending.append(head)
            if body:
                stream.pending.append(memoryview(body))
            if tail:
                stream.pending.append(tail)
            stream.pending_end = stream.pending_end or end
            self._flush(stream)
            return
        size = len(body)
        end_flag = FLAG_END_STREAM if end and not tail else 0
        if size <= stream.send_window and size <= self.send_window and size <= self.peer_max_frame:
            stream.send_window -= size
            self.send_window -= size
            if size or not tail:
                data = _FRAME.pack(size << 8 | DATA, end_flag, stream.stream_id)
                self.write(head + data + body + tail if size or end_flag else head + tail)
            else:
                self.write(head + tail)
            if end:
                self._finish(stream)
            return
        if head:
            stream.pending.append(head)
        stream.pending.append(memoryview(body))
        if tail:
            stream.pending.append(tail)
        stream.pending_end = end
        self._flush(stream)

    def _flush(self, stream: Stream) -> None:
        """Write as much of ``stream``'s waiting output as its and the connection's windows allow."""
        out: list[bytes | memoryview] = []
        pending = stream.pending
        while pending:
            item = pending[0]
            if isinstance(item, memoryview):
                last_data = len(pending) == 1 and stream.pending_end
                while len(item):
                    allowed = min(len(item), stream.send_window, self.send_window, self.peer_max_frame)
                    if allowed <= 0:
                        break
                    chunk = item[:allowed]
                    item = item[allowed:]
                    stream.send_window -= allowed
                    self.send_window -= allowed
                    flags = FLAG_END_STREAM if last_data and not len(item) else 0
                    out.append(_FRAME.pack(allowed << 8 | DATA, flags, stream.stream_id))
                    out.append(bytes(chunk))
                if len(item):
                    pending[0] = item
                    break
                pending.pop(0)
            else:
                out.append(item)
                pending.pop(0)
        if out:
            self.write(b"".join(out))
        if pending:
            self.blocked[stream.stream_id] = stream
            return
        self.blocked.pop(stream.stream_id, None)
        stream.wake()
        if stream.pending_end:
            self._finish(stream)

    def _flush_blocked(self) -> None:
        for stream in list(self.blocked.values()):
            if self.send_window <= 0:
                break
            self._flush(stream)

    def _finish(self, stream: Stream) -> None:
        """Our side is closed: the stream is done once the client's side is too (else it is reset,
        as gRPC servers do when they answer before the request ended)."""
        stream.closed = True
        self.streams.pop(stream.stream_id, None)
        self.blocked.pop(stream.stream_id, None)
        if not stream.remote_closed:
            self.write(frame(RST_STREAM, 0, stream.stream_id, _U32.pack(NO_ERROR)))
        if self.going_away and not self.streams and self.transport is not None:
            self.transport.close()

    def reset_stream(self, stream: Stream, code: int) -> None:
        """End ``stream`` with RST_STREAM from our side."""
        if stream.closed:
            return
        stream.closed = True
        self.streams.pop(stream.stream_id, None)
        self.blocked.pop(stream.stream_id, None)
        stream.pending.clear()
        stream.wake()
        self.write(frame(RST_STREAM, 0, stream.stream_id, _U32.pack(code)))

    def _reset_stream(self, stream_id: int, code: int) -> None:
        self.write(frame(RST_STREAM, 0, stream_id, _U32.pack(code)))

    def goaway(self, code: int = NO_ERROR, message: str = "") -> None:
        """Refuse new streams; the connection closes once its streams are done."""
        if self.going_away and code == NO_ERROR:
            return
        self.going_away = True
        self.write(frame(GOAWAY, 0, 0, _GOAWAY.pack(self.last_stream_id, code) + message.encode()))
        if not self.streams and self.transport is not None:
            self.transport.close()

    def close_with(self, code: int, message: str) -> None:
        """A connection error: GOAWAY with ``code``, then close."""
        log.debug("closing HTTP/2 connection from %s: %s", self.peer, message)
        self.going_away = True
        if self.transport is not None:
            self.write(frame(GOAWAY, 0, 0, _GOAWAY.pack(self.last_stream_id, code) + message.encode()))
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # ---- keepalive ----

    def _arm_keepalive(self) -> None:
        if self.keepalive_time is not None and self.transport is not None:
            self._keepalive = self.loop.call_later(self.keepalive_time, self._send_keepalive)

    def _send_keepalive(self) -> None:
        self._keepalive = None
        if self.transport is None:
            return
        self.write(frame(PING, 0, 0, b"\x00" * 8))
        self._ping_deadline = self.loop.call_later(self.keepalive_timeout, self._keepalive_expired)

    def _keepalive_expired(self) -> None:
        self._ping_deadline = None
        self.close_with(NO_ERROR, "keepalive ping unanswered")
        self.abort()
