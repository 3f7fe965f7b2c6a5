"""The server side of an HTTP/2 connection (RFC 9113) on an asyncio protocol, as much as gRPC needs.

Frames are parsed in place from one receive buffer with struct offsets; each stream's events go to a
``Stream`` that the connection's ``open_stream`` callback creates for a request's HEADERS. Sending is
flow controlled per stream and per connection: what the peer's windows do not admit waits in the stream
until WINDOW_UPDATE gives credit, or the connection goes away.

A peer is bounded the way grpc core, nginx and h2o bound theirs: receive-window credit comes back only as
the application consumes a stream's data (``H2Connection.consumed``), so a stream buffers at most its
window and a connection at most its own; once more than ``WRITE_HIGH_WATER`` bytes wait to be written the
connection stops reading from its peer (and the streams' output waits) until the peer reads, and a peer
that reads nothing for ``SEND_TIMEOUT`` loses the connection; pings follow grpc core's abuse policy, and
SETTINGS, PING, RST_STREAM, refused streams and empty frames have a budget per second, past which the
connection ends with GOAWAY ENHANCE_YOUR_CALM; a connection handles at most ``FRAMES_PER_TURN`` frames
per turn of the event loop, so a flood on one connection does not starve the others.
"""
from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass

import hpack

from .header_block import MAX_DECODED_HEADER_LIST, MAX_HEADER_LIST, HeaderDecoder, HeaderListTooLarge

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
OUR_WINDOW = 16 * 1024 * 1024  # the connection's receive window: what a peer may send that is not consumed yet
OUR_STREAM_WINDOW = 1024 * 1024  # each stream's (SETTINGS_INITIAL_WINDOW_SIZE); H2Connection.want widens it
OUR_MAX_FRAME = 16_384  # what we accept (the protocol's default, which every client respects)
MAX_CONCURRENT_STREAMS = 256  # per connection, as Go's net/http (250) and nginx (128) bound theirs
WRITE_HIGH_WATER = 1 << 20  # bytes waiting to be written past which the connection stops reading its peer
SEND_TIMEOUT = 60.0  # seconds a peer may leave WRITE_HIGH_WATER bytes unread before the connection is aborted
FRAMES_PER_TURN = 256  # frames one connection handles per turn of the event loop
FLOOD_INTERVAL = 1.0  # seconds over which FLOOD_LIMITS count
FLOOD_LIMITS = {"SETTINGS": 100, "PING": 1000, "RST_STREAM": 500, "empty": 100}  # frames per interval
REMEMBERED_CLOSED = 256  # closed streams whose state is kept, to answer late frames on them as RFC 9113 says


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _FRAME.pack(len(payload) << 8 | kind, flags, stream_id) + payload


class ConnectionError_(Exception):
    """A connection error: the connection ends with GOAWAY and this code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PingPolicy:
    """grpc core's policy for the pings a client sends (``Chttp2PingAbusePolicy``): a ping that comes sooner than
    ``min_interval`` seconds after the previous one, with no HEADERS or DATA sent in between, is a strike; more
    than ``max_strikes`` strikes (0: no limit) end the connection with GOAWAY ENHANCE_YOUR_CALM "too_many_pings".
    With no call open the interval is two hours, unless ``permit_without_calls``."""

    min_interval: float = 300.0
    max_strikes: int = 2
    permit_without_calls: bool = False


IDLE_PING_INTERVAL = 7200.0


class Stream:
    """One request stream; the connection calls these on the event loop."""

    __slots__ = ("connection", "stream_id", "send_window", "pending", "pending_end", "remote_closed",
                 "closed", "_drained", "recv_window", "recv_held", "recv_unacked")

    def __init__(self, connection: H2Connection, stream_id: int) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.send_window = connection.peer_initial_window
        self.pending: list[bytes | memoryview] = []  # encoded frames, or DATA payloads awaiting credit (see H2Connection)
        self.pending_end = False
        self.remote_closed = False
        self.closed = False
        self._drained: asyncio.Future[None] | None = None
        self.recv_window = OUR_STREAM_WINDOW  # what the peer may still send before credit comes back
        self.recv_held = 0  # DATA bytes handed to data_received that the application has not consumed yet
        self.recv_unacked = 0  # consumed bytes not yet returned as credit

    def data_received(self, data: bytes, end_stream: bool) -> None:
        """DATA for this stream; once the application has taken the bytes, it calls
        ``connection.consumed(stream, size)``: until then the peer gets no credit for them."""
        raise NotImplementedError

    def end_received(self) -> None:
        """The client half-closed the stream (END_STREAM on its HEADERS or DATA)."""

    def reset(self, code: int) -> None:
        """The client reset the stream, or the connection went away."""

    async def drain(self) -> None:
        """Wait until what this stream has sent is out of its queue (flow-control credit came) and the
        connection's peer reads again, or the stream or connection is gone."""
        connection = self.connection
        while (self.pending or connection.write_paused) and not self.closed and connection.transport is not None:
            self._drained = connection.loop.create_future()
            await self._drained

    def wake(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None


OpenStream = Callable[["H2Connection", int, list[tuple[str, str]], bool], "Stream | None"]


class H2Connection(asyncio.Protocol):
    """One client connection: frames in, frames out."""

    def __init__(self, open_stream: OpenStream, on_close: Callable[[H2Connection], None],
                 keepalive_time: float | None = None, keepalive_timeout: float = 20.0,
                 ping_policy: PingPolicy = PingPolicy()) -> None:
        self.open_stream = open_stream
        self.on_close = on_close
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.preface_seen = False
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0
        # recently closed streams: for those we reset, the DATA the peer may still send on them (in flight)
        self.closed_streams: dict[int, int | None] = {}
        self.decoder = HeaderDecoder()
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16_384
        self.send_window = DEFAULT_WINDOW  # the connection's
        self.recv_window = DEFAULT_WINDOW  # the connection's, until our first WINDOW_UPDATE
        self.recv_unacked = 0
        self.blocked: dict[int, Stream] = {}  # streams with output waiting for credit, or for the peer to read
        self.header_block: bytearray | None = None  # a HEADERS block awaiting its CONTINUATION frames
        self.header_stream = 0
        self.header_end_stream = False
        self.header_self_dependent = False
        self.going_away = False
        self.write_paused = False  # more than WRITE_HIGH_WATER bytes wait for the peer to read them
        self._turn_pending = False  # frames wait in the buffer for the next turn of the event loop
        self._reading_paused = False
        self._send_stalled: asyncio.TimerHandle | None = None
        self.ping_policy = ping_policy
        self._last_ping = float("-inf")
        self._ping_strikes = 0
        self._flood_start = 0.0
        self._flood_counts: dict[str, int] = dict.fromkeys(FLOOD_LIMITS, 0)
        self.peer = ""
        self.keepalive_time = keepalive_time
        self.keepalive_timeout = keepalive_timeout
        self._keepalive: asyncio.TimerHandle | None = None
        self._ping_deadline: asyncio.TimerHandle | None = None

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not registered subclasses
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[union-attr]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = peer[0]
            self.peer = f"ipv6:[{host}]:{peer[1]}" if ":" in host else f"ipv4:{host}:{peer[1]}"
        settings = b"".join(_SETTING.pack(key, value) for key, value in (
            (SETTINGS_MAX_CONCURRENT_STREAMS, MAX_CONCURRENT_STREAMS),
            (SETTINGS_INITIAL_WINDOW_SIZE, OUR_STREAM_WINDOW), (SETTINGS_MAX_FRAME_SIZE, OUR_MAX_FRAME),
            (SETTINGS_ENABLE_PUSH, 0), (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST)))
        self.write(frame(SETTINGS, 0, 0, settings)
                   + frame(WINDOW_UPDATE, 0, 0, _U32.pack(OUR_WINDOW - DEFAULT_WINDOW)))
        self.recv_window = OUR_WINDOW
        self._arm_keepalive()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for timer in (self._keepalive, self._ping_deadline, self._send_stalled):
            if timer is not None:
                timer.cancel()
        streams, self.streams = self.streams, {}
        self.blocked.clear()
        self.buffer = bytearray()
        for stream in streams.values():
            stream.closed = True
            stream.wake()
            stream.reset(CANCEL)
        self.on_close(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._process()

    def pause_writing(self) -> None:
        """The transport holds more than WRITE_HIGH_WATER bytes: stop reading the peer and producing output
        until it reads; a peer that does not within SEND_TIMEOUT loses the connection."""
        self.write_paused = True
        self._set_reading()
        self._send_stalled = self.loop.call_later(SEND_TIMEOUT, self._send_timed_out)

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._send_stalled is not None:
            self._send_stalled.cancel()
            self._send_stalled = None
        self._flush_blocked()
        for stream in list(self.streams.values()):
            if stream._drained is not None and not stream.pending:
                stream.wake()
        self._next_turn()

    # ---- receiving ----

    def _process(self) -> None:
        """Handle the frames in the buffer, at most FRAMES_PER_TURN of them; the rest wait for a later turn
        (reading paused meanwhile), or for the peer to read what we sent."""
        self._turn_pending = False
        buffer = self.buffer
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
            offset, more = self._frames(buffer)
            if offset:
                del buffer[:offset]
            if more and not self.write_paused:
                self._next_turn()
        except ConnectionError_ as error:
            self.close_with(error.code, str(error))
        except Exception:  # a bug must end this connection only
            log.exception("HTTP/2 connection failed")
            self.close_with(INTERNAL_ERROR, "internal error")
        self._set_reading()

    def _next_turn(self) -> None:
        if not self._turn_pending and self.transport is not None:
            self._turn_pending = True
            self.loop.call_soon(self._process)
        self._set_reading()

    def _set_reading(self) -> None:
        """Read from the peer unless its output is over the high-water mark or frames wait for a later turn."""
        paused = self.write_paused or self._turn_pending
        transport = self.transport
        if paused != self._reading_paused and transport is not None and not transport.is_closing():
            self._reading_paused = paused
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _frames(self, buffer: bytearray) -> tuple[int, bool]:
        """Handle whole frames from the start of ``buffer``: the bytes used, and whether whole frames are left."""
        view = memoryview(buffer)
        offset, size, handled = 0, len(buffer), 0
        try:
            while size - offset >= 9:
                length_kind, flags, stream_id = _FRAME.unpack_from(buffer, offset)
                length, kind, stream_id = length_kind >> 8, length_kind & 0xFF, stream_id & 0x7FFFFFFF
                if length > OUR_MAX_FRAME:
                    raise ConnectionError_(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                end = offset + 9 + length
                if end > size:
                    break
                if handled == FRAMES_PER_TURN or self.write_paused or self.transport is None:
                    return offset, True
                handled += 1
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
                    if length < 8:
                        raise ConnectionError_(FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
                    self.going_away = True
                elif kind == PRIORITY:
                    self._priority(stream_id, payload)
                elif kind == PUSH_PROMISE:
                    raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
                # unknown frame types are ignored (RFC 9113 §4.1)
        finally:
            view.release()
        return offset, False

    def _flood(self, kind: str) -> None:
        """Count one ``kind`` frame against its budget for this interval; past it, the connection ends."""
        now = self.loop.time()
        counts = self._flood_counts
        if now - self._flood_start >= FLOOD_INTERVAL:
            self._flood_start = now
            for key in counts:
                counts[key] = 0
        counts[kind] += 1
        if counts[kind] > FLOOD_LIMITS[kind]:
            raise ConnectionError_(ENHANCE_YOUR_CALM, f"more than {FLOOD_LIMITS[kind]} {kind} frames in "
                                                      f"{FLOOD_INTERVAL:g} s")

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
        length = len(payload)
        self.recv_window -= length
        if self.recv_window < 0:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA beyond the connection's receive window")
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            self._credit_connection(length)  # discarded: the connection's credit comes back at once
            allowed = self.closed_streams.get(stream_id)
            if allowed is None:
                self._flood("RST_STREAM")
                self._reset_stream(stream_id, STREAM_CLOSED)
            elif allowed < length:  # frames in flight after our RST_STREAM are ignored, as far as the window went
                raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA beyond the window of a reset stream")
            else:
                self.closed_streams[stream_id] = allowed - length
            return
        body = self._unpad(flags, payload)
        stream.recv_window -= length
        if stream.recv_window < 0 or stream.remote_closed:
            self._credit_connection(length)
            self._stream_error(stream, FLOW_CONTROL_ERROR if stream.recv_window < 0 else STREAM_CLOSED)
            return
        end = bool(flags & FLAG_END_STREAM)
        if not body and not end:
            self._flood("empty")
        stream.recv_held += length
        if length > len(body):  # padding is consumed as it arrives
            self.consumed(stream, length - len(body))
        if end:
            stream.remote_closed = True
        if body:
            stream.data_received(bytes(body), end)
        if end:
            stream.end_received()

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._unpad(flags, payload)
        self.header_self_dependent = False
        if flags & FLAG_PRIORITY:
            if len(block) < 5:
                raise ConnectionError_(FRAME_SIZE_ERROR, "HEADERS priority fields missing")
            self.header_self_dependent = _U32.unpack_from(block)[0] & 0x7FFFFFFF == stream_id
            block = block[5:]
        self.header_stream = stream_id
        self.header_end_stream = bool(flags & FLAG_END_STREAM)
        if flags & FLAG_END_HEADERS:
            self._header_block(bytes(block))
        else:
            if not block:
                self._flood("empty")
            self.header_block = bytearray(block)

    def _continuation(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if self.header_block is None or stream_id != self.header_stream:
            raise ConnectionError_(PROTOCOL_ERROR, "unexpected CONTINUATION")
        if not payload and not flags & FLAG_END_HEADERS:
            self._flood("empty")
        self.header_block += payload
        if len(self.header_block) > MAX_DECODED_HEADER_LIST:  # HPACK never makes a field list smaller than this
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
        if flags & FLAG_END_HEADERS:
            block, self.header_block = bytes(self.header_block), None
            self._header_block(block)

    def _header_block(self, block: bytes) -> None:
        stream_id, end_stream = self.header_stream, self.header_end_stream
        too_large = 0
        problem: str | None = None
        try:
            headers, problem = self.decoder.decode(block)
        except HeaderListTooLarge as error:
            headers, too_large = [], error.size
        except hpack.OversizedHeaderListError:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header list too large") from None
        except Exception as error:  # hpack's errors: the decoder's state is lost, so is the connection
            raise ConnectionError_(COMPRESSION_ERROR, f"header block: {error}") from None
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client: gRPC clients send none; they end the stream
            if stream.remote_closed:
                self._stream_error(stream, STREAM_CLOSED)
            elif not end_stream or self.header_self_dependent or any(name[:1] == ":" for name, _ in headers):
                self._stream_error(stream, PROTOCOL_ERROR)  # a malformed request (RFC 9113 §8.1)
            else:
                stream.remote_closed = True
                stream.end_received()
            return
        if stream_id % 2 == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "even stream id from a client")
        if stream_id <= self.last_stream_id:
            if stream_id in self.closed_streams:
                if self.closed_streams[stream_id] is not None:
                    return  # we reset it: frames still in flight are ignored
                raise ConnectionError_(STREAM_CLOSED, "HEADERS on a closed stream")
            raise ConnectionError_(PROTOCOL_ERROR, "stream id lower than an earlier stream's")
        self.last_stream_id = stream_id
        if self.header_self_dependent or problem is not None:
            log.debug("malformed request from %s: %s", self.peer, problem or "a stream depending on itself")
            self._refuse(stream_id, PROTOCOL_ERROR)
        elif self.going_away or len(self.streams) >= MAX_CONCURRENT_STREAMS:
            self._flood("RST_STREAM")  # a client that ignores SETTINGS_MAX_CONCURRENT_STREAMS
            self._refuse(stream_id, REFUSED_STREAM)
        elif too_large:  # RFC 9113 §10.5.1: the block was decoded, the request is answered 431
            log.debug("refusing a header list of %d bytes from %s", too_large, self.peer)
            self.write(frame(HEADERS, FLAG_END_HEADERS | FLAG_END_STREAM, stream_id, b"\x08\x03431"))
            if not end_stream:
                self._refuse(stream_id, NO_ERROR)
            else:
                self._remember_closed(stream_id, None)
        else:
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
        self._flood("SETTINGS")
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                delta, self.peer_initial_window = value - self.peer_initial_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:  # RFC 9113 §6.9.2
                        raise ConnectionError_(FLOW_CONTROL_ERROR, "a stream's window overflows")
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
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return
        if increment == 0:
            self._stream_error(stream, PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._stream_error(stream, FLOW_CONTROL_ERROR)
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
        self._flood("PING")
        policy = self.ping_policy
        now = self.loop.time()
        interval = policy.min_interval if self.streams or policy.permit_without_calls else IDLE_PING_INTERVAL
        too_soon = now < self._last_ping + interval
        self._last_ping = now
        if too_soon:
            self._ping_strikes += 1
            if policy.max_strikes and self._ping_strikes > policy.max_strikes:
                raise ConnectionError_(ENHANCE_YOUR_CALM, "too_many_pings")
        self.write(frame(PING, FLAG_ACK, 0, bytes(payload)))

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "RST_STREAM length not 4")
        if stream_id > self.last_stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        self._flood("RST_STREAM")
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._forget(stream, False)
            stream.pending.clear()
            stream.wake()
            stream.reset(_U32.unpack_from(payload)[0])

    def _priority(self, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            self._stream_error_id(stream_id, FRAME_SIZE_ERROR)
        elif _U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
            self._stream_error_id(stream_id, PROTOCOL_ERROR)  # a stream cannot depend on itself (RFC 9113 §5.3.1)

    def consumed(self, stream: Stream, size: int) -> None:
        """The application has taken ``size`` bytes of ``stream``'s DATA: the peer may send that much more.
        Credit goes back in WINDOW_UPDATE frames of at least a quarter of the window."""
        if stream.closed or size <= 0:
            return  # a closed stream's unconsumed bytes were credited to the connection when it closed
        stream.recv_held -= size
        stream.recv_unacked += size
        if stream.recv_unacked >= OUR_STREAM_WINDOW // 4 and not stream.remote_closed:
            stream.recv_window += stream.recv_unacked
            self.write(frame(WINDOW_UPDATE, 0, stream.stream_id, _U32.pack(stream.recv_unacked)))
            stream.recv_unacked = 0
        self._credit_connection(size)

    def want(self, stream: Stream, size: int) -> None:
        """The application waits for ``size`` more bytes of ``stream`` (a message it will consume as it
        arrives): widen the stream's window to let them come at once, as grpc core does for a large message."""
        missing = size - stream.recv_window - stream.recv_unacked
        if missing > 0 and not stream.closed and not stream.remote_closed:
            credit = missing + stream.recv_unacked
            stream.recv_window += credit
            stream.recv_unacked = 0
            self.write(frame(WINDOW_UPDATE, 0, stream.stream_id, _U32.pack(credit)))

    def _credit_connection(self, size: int) -> None:
        self.recv_unacked += size
        if self.recv_unacked >= OUR_WINDOW // 4:
            self.recv_window += self.recv_unacked
            self.write(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.recv_unacked)))
            self.recv_unacked = 0

    # ---- sending ----

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def send(self, stream: Stream, head: bytes, body: bytes, tail: bytes, end: bool) -> None:
        """Send ``head`` (HEADERS frames, or b""), ``body`` as DATA frames as far as the windows allow,
        then ``tail`` (trailing HEADERS frames, or b""); ``end`` closes our side. What does not fit, or
        finds the peer not reading, waits in the stream. One transport write when everything fits."""
        if stream.closed:
            return
        self._last_ping, self._ping_strikes = float("-inf"), 0  # HEADERS or DATA sent: pings are welcome again
        if stream.pending:  # earlier output still waits: keep the order
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
        if (size <= stream.send_window and size <= self.send_window and size <= self.peer_max_frame
                and not self.write_paused):
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
        """Write as much of ``stream``'s waiting output as its and the connection's windows allow, unless
        the peer is not reading what was written."""
        out: list[bytes | memoryview] = []
        pending = stream.pending
        while pending and not self.write_paused:
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
            if self.send_window <= 0 or self.write_paused:
                break
            self._flush(stream)

    def _forget(self, stream: Stream, reset_by_us: bool) -> None:
        """``stream`` is closed: drop it, and give back the connection's credit for DATA it never consumed."""
        stream.closed = True
        self.streams.pop(stream.stream_id, None)
        self.blocked.pop(stream.stream_id, None)
        self._remember_closed(stream.stream_id, stream.recv_window if reset_by_us else None)
        if stream.recv_held > 0:
            held, stream.recv_held = stream.recv_held, 0
            self._credit_connection(held)

    def _remember_closed(self, stream_id: int, window: int | None) -> None:
        """Keep ``stream_id``'s state: ``window`` for a stream we reset (what may still come), else None."""
        closed = self.closed_streams
        closed[stream_id] = window
        if len(closed) > REMEMBERED_CLOSED:
            del closed[next(iter(closed))]

    def _finish(self, stream: Stream) -> None:
        """Our side is closed: the stream is done once the client's side is too (else it is reset,
        as gRPC servers do when they answer before the request ended)."""
        self._forget(stream, not stream.remote_closed)
        if not stream.remote_closed:
            self.write(frame(RST_STREAM, 0, stream.stream_id, _U32.pack(NO_ERROR)))
        if self.going_away and not self.streams and self.transport is not None:
            self.transport.close()

    def reset_stream(self, stream: Stream, code: int) -> None:
        """End ``stream`` with RST_STREAM from our side."""
        if stream.closed:
            return
        self._forget(stream, True)
        stream.pending.clear()
        stream.wake()
        self.write(frame(RST_STREAM, 0, stream.stream_id, _U32.pack(code)))

    def _stream_error(self, stream: Stream, code: int) -> None:
        """A stream error (RFC 9113 §5.4.2): RST_STREAM with ``code``, and the application's call ends."""
        self.reset_stream(stream, code)
        stream.reset(code)

    def _stream_error_id(self, stream_id: int, code: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._stream_error(stream, code)
        else:
            self._refuse(stream_id, code)

    def _refuse(self, stream_id: int, code: int) -> None:
        """RST_STREAM for a stream that has no Stream; frames still in flight on it are ignored."""
        self._remember_closed(stream_id, OUR_STREAM_WINDOW)
        self._reset_stream(stream_id, code)

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
        """A connection error: GOAWAY with ``code``, then close; a peer that does not read what is left
        loses the connection at once, or after SEND_TIMEOUT."""
        log.debug("closing HTTP/2 connection from %s: %s", self.peer, message)
        self.going_away = True
        self.buffer = bytearray()
        if self.transport is not None:
            self.write(frame(GOAWAY, 0, 0, _GOAWAY.pack(self.last_stream_id, code) + message.encode()))
            if self.write_paused:
                self.transport.abort()
            else:
                self.transport.close()
                if self._send_stalled is None:
                    self._send_stalled = self.loop.call_later(SEND_TIMEOUT, self.abort)

    def _send_timed_out(self) -> None:
        self._send_stalled = None
        log.debug("aborting HTTP/2 connection from %s: it read nothing for %g s", self.peer, SEND_TIMEOUT)
        self.abort()

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
