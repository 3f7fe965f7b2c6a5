"""HTTP/2 conformance of the native gRPC transport, from RFC 9113's MUST requirements in the spirit of h2spec
(which cannot be installed here): one raw connection per case, the bytes a case sends after the connection
preface and an empty SETTINGS, and the answer the RFC requires. "connection" cases expect GOAWAY with the
code, then the connection closed; "stream" cases expect RST_STREAM with the code on that stream; "reply"
cases expect a frame. What the transport does not check is listed at the end of this docstring.

Not checked: content-length against the DATA received (RFC 9113 §8.1.1; gRPC requests carry none, and the
transport does not read the field), and the characters of field names beyond upper case (§8.2.1).
"""
from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from triton_serve._engine.frontend.grpc import h2
from triton_serve._engine.frontend.grpc.server import GrpcOptions
from triton_serve._engine.protos import grpc_service_pb2 as pb
from triton_serve._engine.server import ServerOptions
from triton_serve.testing import RunningServer, ToyBackendsPlugin, free_port, probe_config

from .conftest import ADD_SUB, write_model
from .test_h2_limits import INFER, STREAM_INFER, RawClient, data_frames, grpc_message

HEALTH = "/grpc.health.v1.Health/Check"
SLOW = 3.0  # seconds the probe model takes: a call stays open (half-closed by the client) meanwhile


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    repo = tmp_path_factory.mktemp("h2_conformance")
    write_model(repo, "add_sub", ADD_SUB)
    write_model(repo, "probe", probe_config(max_batch_size=0))
    running = RunningServer(ServerOptions(
        model_repositories=[str(repo)], extra_plugins=[("toy", ToyBackendsPlugin())], http_port=free_port(),
        grpc_port=free_port(), metrics_port=free_port(), http_address="127.0.0.1", grpc_address="127.0.0.1",
        allow_metrics=False, frontend_processes=0, grpc_options=GrpcOptions(transport="native")))
    yield running.options.grpc_port
    running.stop()


def _u32(value: int) -> bytes:
    return struct.pack(">I", value)


def _setting(key: int, value: int) -> bytes:
    return h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", key, value))


def _open(client: RawClient, stream_id: int = 1, path: str = INFER, flags: int = h2.FLAG_END_HEADERS) -> bytes:
    return h2.frame(h2.HEADERS, flags, stream_id, client.headers(path))


def _slow_request() -> bytes:
    request = pb.ModelInferRequest(model_name="probe", raw_input_contents=[np.array([SLOW], np.float32).tobytes()])
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    return grpc_message(request.SerializeToString())


def _half_closed(client: RawClient) -> bytes:
    """Stream 1 half-closed by the client: the request ended, the answer takes SLOW seconds."""
    return _open(client) + data_frames(1, _slow_request(), True)


def _closed(client: RawClient) -> bytes:
    """Stream 1 closed both ways: a health check, answered before this returns."""
    client.send(_open(client, path=HEALTH) + data_frames(1, grpc_message(b""), True))
    for kind, flags, stream, _payload in client.frames(time.monotonic() + 10):
        if kind == h2.HEADERS and stream == 1 and flags & h2.FLAG_END_STREAM:
            return b""
    raise AssertionError("the health check was not answered")


def _stalled_stream(client: RawClient) -> bytes:
    """A ModelStreamInfer call whose first answer cannot be sent (the client's windows are 0), so its handler
    takes no further request and the client gets no credit: 2 MiB more exceed the stream's 1 MiB window."""
    request = pb.ModelInferRequest(model_name="add_sub",
                                   raw_input_contents=[np.zeros(16, np.int32).tobytes()] * 2)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    message = grpc_message(request.SerializeToString())
    client.send(_setting(h2.SETTINGS_INITIAL_WINDOW_SIZE, 0) + _open(client, path=STREAM_INFER)
                + data_frames(1, message, False))
    for kind, _flags, stream, _payload in client.frames(time.monotonic() + 10):
        if kind == h2.HEADERS and stream == 1:  # the answer's HEADERS went out; its DATA waits for credit
            break
    filler = message * ((2 << 20) // len(message))
    return data_frames(1, filler, False)


REQUEST = ((":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "x"),
           ("content-type", "application/grpc"), ("te", "trailers"))


def _request(client: RawClient, fields: tuple[tuple[str, str], ...]) -> bytes:
    """HEADERS opening stream 1 with exactly ``fields``."""
    return h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, 1, client.encoder.encode(list(fields)))


def _large_headers(client: RawClient, size: int) -> bytes:
    """A request on stream 1 with ``size`` bytes of header values, in HEADERS and CONTINUATION frames."""
    block = client.headers(INFER, tuple((f"x-big-{i}", "v" * 4000) for i in range(size // 4000)))
    parts = [block[i:i + h2.OUR_MAX_FRAME] for i in range(0, len(block), h2.OUR_MAX_FRAME)]
    frames = [h2.frame(h2.HEADERS if i == 0 else h2.CONTINUATION, h2.FLAG_END_HEADERS if i == len(parts) - 1 else 0,
                       1, part) for i, part in enumerate(parts)]
    frames[0] = frames[0][:4] + bytes((frames[0][4] | h2.FLAG_END_STREAM,)) + frames[0][5:]
    return b"".join(frames)


@dataclass(frozen=True)
class Case:
    section: str
    what: str
    send: Callable[[RawClient], bytes]
    expect: str  # "connection", "stream" or "reply"
    code: int = 0  # the error code; for "reply", the frame type expected
    stream: int = 1

    def __str__(self) -> str:
        return f"{self.section} {self.what}"


PROTOCOL, FRAME_SIZE, FLOW = h2.PROTOCOL_ERROR, h2.FRAME_SIZE_ERROR, h2.FLOW_CONTROL_ERROR
CASES = [
    # §4: frames
    Case("4.1", "unknown frame type is ignored",
         lambda c: h2.frame(0xEE, 0, 0, b"x") + h2.frame(h2.PING, 0, 0, bytes(8)), "reply", h2.PING),
    Case("4.1", "unknown flags are ignored", lambda c: h2.frame(h2.PING, 0x10, 0, bytes(8)), "reply", h2.PING),
    Case("4.2", "DATA larger than SETTINGS_MAX_FRAME_SIZE", lambda c: _open(c) + struct.pack(
        ">IBI", (h2.OUR_MAX_FRAME + 1) << 8 | h2.DATA, 0, 1) + bytes(h2.OUR_MAX_FRAME + 1), "connection", FRAME_SIZE),
    Case("4.2", "HEADERS larger than SETTINGS_MAX_FRAME_SIZE", lambda c: struct.pack(
        ">IBI", (h2.OUR_MAX_FRAME + 1) << 8 | h2.HEADERS, 4, 1) + bytes(h2.OUR_MAX_FRAME + 1),
         "connection", FRAME_SIZE),
    Case("4.3", "a header block that does not decode", lambda c: h2.frame(h2.HEADERS, 5, 1, b"\xff\xff\xff"),
         "connection", h2.COMPRESSION_ERROR),
    # §5.1: stream states
    Case("5.1", "idle: DATA", lambda c: h2.frame(h2.DATA, 0, 1, b"x"), "connection", PROTOCOL),
    Case("5.1", "idle: RST_STREAM", lambda c: h2.frame(h2.RST_STREAM, 0, 1, _u32(8)), "connection", PROTOCOL),
    Case("5.1", "idle: WINDOW_UPDATE", lambda c: h2.frame(h2.WINDOW_UPDATE, 0, 1, _u32(1)), "connection", PROTOCOL),
    Case("5.1", "idle: CONTINUATION", lambda c: h2.frame(h2.CONTINUATION, 4, 1, c.headers(INFER)),
         "connection", PROTOCOL),
    Case("5.1", "half-closed (remote): DATA", lambda c: _half_closed(c) + h2.frame(h2.DATA, 0, 1, b"x"),
         "stream", h2.STREAM_CLOSED),
    Case("5.1", "half-closed (remote): HEADERS", lambda c: _half_closed(c) + _open(c, flags=5),
         "stream", h2.STREAM_CLOSED),
    Case("5.1", "closed: DATA", lambda c: _closed(c) + h2.frame(h2.DATA, 0, 1, b"x"), "stream", h2.STREAM_CLOSED),
    Case("5.1", "closed: HEADERS", lambda c: _closed(c) + _open(c), "connection", h2.STREAM_CLOSED),
    Case("5.1.1", "an even stream id", lambda c: _open(c, stream_id=2), "connection", PROTOCOL),
    Case("5.1.1", "a stream id lower than an earlier one", lambda c: _open(c, 5) + _open(c, 3), "connection", PROTOCOL),
    Case("5.1.2", "more streams than SETTINGS_MAX_CONCURRENT_STREAMS",
         lambda c: b"".join(_open(c, 1 + 2 * i) for i in range(h2.MAX_CONCURRENT_STREAMS + 1)), "stream",
         h2.REFUSED_STREAM, 1 + 2 * h2.MAX_CONCURRENT_STREAMS),
    Case("5.3.1", "HEADERS depending on its own stream", lambda c: h2.frame(
        h2.HEADERS, h2.FLAG_END_HEADERS | h2.FLAG_PRIORITY, 1, _u32(1) + b"\x10" + c.headers(INFER)),
         "stream", PROTOCOL),
    Case("5.3.1", "PRIORITY depending on its own stream", lambda c: h2.frame(h2.PRIORITY, 0, 1, _u32(1) + b"\x10"),
         "stream", PROTOCOL),
    # §6.1-6.4: DATA, HEADERS, PRIORITY, RST_STREAM
    Case("6.1", "DATA on stream 0", lambda c: h2.frame(h2.DATA, 0, 0, b"x"), "connection", PROTOCOL),
    Case("6.1", "DATA padding as long as the frame",
         lambda c: _open(c) + h2.frame(h2.DATA, h2.FLAG_PADDED, 1, b"\x04abc"), "connection", PROTOCOL),
    Case("6.2", "HEADERS on stream 0", lambda c: _open(c, stream_id=0), "connection", PROTOCOL),
    Case("6.2", "HEADERS padding as long as the frame", lambda c: h2.frame(
        h2.HEADERS, h2.FLAG_END_HEADERS | h2.FLAG_PADDED, 1, b"\x09" + c.headers(INFER)[:8]), "connection", PROTOCOL),
    Case("6.3", "PRIORITY on stream 0", lambda c: h2.frame(h2.PRIORITY, 0, 0, bytes(5)), "connection", PROTOCOL),
    Case("6.3", "PRIORITY not 5 bytes long", lambda c: h2.frame(h2.PRIORITY, 0, 1, bytes(4)), "stream", FRAME_SIZE),
    Case("6.4", "RST_STREAM on stream 0", lambda c: h2.frame(h2.RST_STREAM, 0, 0, _u32(8)), "connection", PROTOCOL),
    Case("6.4", "RST_STREAM not 4 bytes long", lambda c: _open(c) + h2.frame(h2.RST_STREAM, 0, 1, bytes(3)),
         "connection", FRAME_SIZE),
    # §6.5: SETTINGS
    Case("6.5", "SETTINGS is acknowledged", lambda c: _setting(h2.SETTINGS_HEADER_TABLE_SIZE, 4096),
         "reply", h2.SETTINGS),
    Case("6.5", "an unknown setting is ignored", lambda c: _setting(0xFF, 1), "reply", h2.SETTINGS),
    Case("6.5", "SETTINGS ACK with a payload", lambda c: h2.frame(h2.SETTINGS, h2.FLAG_ACK, 0, bytes(6)),
         "connection", FRAME_SIZE),
    Case("6.5", "SETTINGS on a stream", lambda c: h2.frame(h2.SETTINGS, 0, 1, bytes(6)), "connection", PROTOCOL),
    Case("6.5", "SETTINGS length not a multiple of 6", lambda c: h2.frame(h2.SETTINGS, 0, 0, bytes(3)),
         "connection", FRAME_SIZE),
    Case("6.5.2", "SETTINGS_ENABLE_PUSH of 2", lambda c: _setting(h2.SETTINGS_ENABLE_PUSH, 2), "connection", PROTOCOL),
    Case("6.5.2", "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
         lambda c: _setting(h2.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 31), "connection", FLOW),
    Case("6.5.2", "SETTINGS_MAX_FRAME_SIZE below 16,384", lambda c: _setting(h2.SETTINGS_MAX_FRAME_SIZE, 16_383),
         "connection", PROTOCOL),
    Case("6.5.2", "SETTINGS_MAX_FRAME_SIZE above 2^24-1", lambda c: _setting(h2.SETTINGS_MAX_FRAME_SIZE, 1 << 24),
         "connection", PROTOCOL),
    # §6.7: PING
    Case("6.7", "PING is answered with ACK and the same payload", lambda c: h2.frame(h2.PING, 0, 0, b"pingdata"),
         "reply", h2.PING),
    Case("6.7", "PING on a stream", lambda c: h2.frame(h2.PING, 0, 1, bytes(8)), "connection", PROTOCOL),
    Case("6.7", "PING not 8 bytes long", lambda c: h2.frame(h2.PING, 0, 0, bytes(6)), "connection", FRAME_SIZE),
    # §6.8: GOAWAY
    Case("6.8", "GOAWAY on a stream", lambda c: h2.frame(h2.GOAWAY, 0, 1, bytes(8)), "connection", PROTOCOL),
    # §6.9: WINDOW_UPDATE and flow control
    Case("6.9", "WINDOW_UPDATE of 0 on the connection", lambda c: h2.frame(h2.WINDOW_UPDATE, 0, 0, _u32(0)),
         "connection", PROTOCOL),
    Case("6.9", "WINDOW_UPDATE of 0 on a stream", lambda c: _open(c) + h2.frame(h2.WINDOW_UPDATE, 0, 1, _u32(0)),
         "stream", PROTOCOL),
    Case("6.9", "WINDOW_UPDATE not 4 bytes long", lambda c: h2.frame(h2.WINDOW_UPDATE, 0, 0, bytes(3)),
         "connection", FRAME_SIZE),
    Case("6.9.1", "the connection's send window above 2^31-1",
         lambda c: h2.frame(h2.WINDOW_UPDATE, 0, 0, _u32(h2.MAX_WINDOW)), "connection", FLOW),
    Case("6.9.1", "a stream's send window above 2^31-1",
         lambda c: _open(c) + h2.frame(h2.WINDOW_UPDATE, 0, 1, _u32(h2.MAX_WINDOW)), "stream", FLOW),
    Case("6.9.1", "DATA beyond the stream's receive window (credit comes back only as the call consumes)",
         _stalled_stream, "stream", FLOW),
    Case("6.9.2", "SETTINGS_INITIAL_WINDOW_SIZE overflowing an open stream's window",
         lambda c: _open(c) + h2.frame(h2.WINDOW_UPDATE, 0, 1, _u32(h2.MAX_WINDOW - h2.DEFAULT_WINDOW))
         + _setting(h2.SETTINGS_INITIAL_WINDOW_SIZE, h2.DEFAULT_WINDOW + 1), "connection", FLOW),
    # §6.10: CONTINUATION
    Case("6.10", "another frame inside a header block", lambda c: _open(c, flags=0) + h2.frame(h2.PING, 0, 0, bytes(8)),
         "connection", PROTOCOL),
    Case("6.10", "CONTINUATION on another stream", lambda c: _open(c, flags=0) + h2.frame(h2.CONTINUATION, 4, 3, b""),
         "connection", PROTOCOL),
    Case("6.10", "CONTINUATION after END_HEADERS", lambda c: _open(c) + h2.frame(h2.CONTINUATION, 4, 1, b""),
         "connection", PROTOCOL),
    # §8: malformed requests, and §10.5.1
    Case("8.1", "trailers without END_STREAM", lambda c: _open(c) + h2.frame(
        h2.HEADERS, h2.FLAG_END_HEADERS, 1, c.encoder.encode([("x-trailer", "1")])), "stream", PROTOCOL),
    Case("8.1", "a pseudo-header field in trailers", lambda c: _open(c) + h2.frame(
        h2.HEADERS, h2.FLAG_END_HEADERS | h2.FLAG_END_STREAM, 1, c.encoder.encode([(":path", "/")])),
         "stream", PROTOCOL),
    Case("8.2.1", "an upper-case field name", lambda c: _request(c, (*REQUEST, ("X-Upper", "1"))), "stream", PROTOCOL),
    Case("8.2.1", "a field value with a line feed", lambda c: _request(c, (*REQUEST, ("x-a", "1\n2"))),
         "stream", PROTOCOL),
    Case("8.2.1", "a field value ending in a space", lambda c: _request(c, (*REQUEST, ("x-a", "1 "))),
         "stream", PROTOCOL),
    Case("8.2.2", "a connection-specific field", lambda c: _request(c, (*REQUEST, ("connection", "keep-alive"))),
         "stream", PROTOCOL),
    Case("8.2.2", "TE other than trailers", lambda c: _request(c, (*REQUEST[:5], ("te", "gzip"))), "stream", PROTOCOL),
    Case("8.3", "an unknown pseudo-header field", lambda c: _request(c, ((":status", "200"), *REQUEST)),
         "stream", PROTOCOL),
    Case("8.3", "a pseudo-header field after a regular one", lambda c: _request(c, (*REQUEST[1:], REQUEST[0])),
         "stream", PROTOCOL),
    Case("8.3", "a repeated pseudo-header field", lambda c: _request(c, (REQUEST[0], *REQUEST)), "stream", PROTOCOL),
    Case("8.3.1", "no :path", lambda c: _request(c, (*REQUEST[:2], *REQUEST[3:])), "stream", PROTOCOL),
    Case("8.3.1", "an empty :path", lambda c: _request(c, (*REQUEST[:2], (":path", ""), *REQUEST[3:])),
         "stream", PROTOCOL),
    Case("10.5.1", "a header list over SETTINGS_MAX_HEADER_LIST_SIZE is answered 431", lambda c: _large_headers(
        c, 5 * 4000), "reply", h2.HEADERS),
    Case("10.5.1", "a header block far over it ends the connection", lambda c: _large_headers(c, 80_000),
         "connection", h2.ENHANCE_YOUR_CALM),
]


def _answer(client: RawClient, case: Case) -> tuple[int, int, int, bytes] | None:
    """The first frame that is the case's answer (GOAWAY, RST_STREAM on its stream, or the frame expected)."""
    for frame in client.frames(time.monotonic() + 10):
        kind, flags, stream, _payload = frame
        if kind == h2.GOAWAY or (kind == h2.RST_STREAM and stream == case.stream and case.expect == "stream"):
            return frame
        if case.expect == "reply" and kind == case.code and (kind != h2.SETTINGS or flags & h2.FLAG_ACK) \
                and (kind != h2.PING or flags & h2.FLAG_ACK) and (kind != h2.HEADERS or stream == case.stream):
            return frame
    return None


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rfc9113(port: int, case: Case) -> None:
    with RawClient(port) as client:
        client.send(case.send(client))
        answer = _answer(client, case)
        assert answer is not None, "no answer"
        kind, _flags, stream, payload = answer
        if case.expect == "connection":
            assert kind == h2.GOAWAY and struct.unpack_from(">I", payload, 4)[0] == case.code, answer
            assert client.ended(timeout=10)[0], "the connection stayed open after GOAWAY"
        elif case.expect == "stream":
            assert (kind, stream, struct.unpack(">I", payload)[0]) == (h2.RST_STREAM, case.stream, case.code), answer
        elif kind == h2.PING:
            assert payload == case.send(client)[-8:]  # the same opaque data
        elif kind == h2.HEADERS:
            assert payload[:5] == b"\x08\x03431"
