"""--grpc-transport=native: tritonclient.grpc (sync and aio) against our own HTTP/2 + gRPC framing, the same
answers as the grpcio transport, flow control, compression, deadlines, streams, and bad bytes on the wire."""
from __future__ import annotations

import asyncio
import gzip
import queue
import socket
import ssl
import struct

import grpc
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from triton_serve._engine.cli import build_parser, options_from_args
from triton_serve._engine.frontend.grpc import h2
from triton_serve._engine.frontend.grpc.header_block import HeaderDecoder
from triton_serve._engine.frontend.grpc.server import GrpcOptions
from triton_serve._engine.protos import grpc_service_pb2 as pb
from triton_serve._engine.protos import health_pb2, health_pb2_grpc
from triton_serve._engine.frontend.restricted import GRPC_HEADER_PREFIX, parse_restrictions
from triton_serve.testing import probe_config

from .conftest import ADD_SUB, REPEAT
from .test_grpc_transport import certificates  # noqa: F401  # the fixture

IDENTITY = """
backend: "toy_identity"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
"""


def _native(**fields):  # type: ignore[no-untyped-def]
    return GrpcOptions(transport="native", **fields)


@pytest.fixture
def models(add_model):  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("identity", IDENTITY)
    add_model("repeat", REPEAT)
    add_model("probe", probe_config(max_batch_size=0))


@pytest.fixture
def server(models, toy_server):  # type: ignore[no-untyped-def]
    return toy_server(grpc_options=_native())


def _add_sub_inputs(module):  # type: ignore[no-untyped-def]
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs.append(tensor)
    return inputs


def _identity_input(data: np.ndarray) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [data.size], "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor]


def _error(call) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as caught:
        call()
    return str(caught.value.status()), caught.value.message()


def test_the_flag_selects_the_transport() -> None:
    args = build_parser().parse_args(["--grpc-transport", "native"])
    assert options_from_args(args).grpc_options.transport == "native"
    assert options_from_args(build_parser().parse_args([])).grpc_options.transport == ""  # native, grpcio with TLS


@pytest.mark.parametrize("frontend_processes", [0, 2], ids=lambda count: f"frontend_processes={count}")
def test_metadata_health_and_infer(server) -> None:  # type: ignore[no-untyped-def]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("add_sub")
        assert client.get_model_metadata("add_sub", as_json=True)["name"] == "add_sub"
        assert client.get_model_config("add_sub").config.max_batch_size == 8
        result = client.infer("add_sub", _add_sub_inputs(grpcclient), headers={"x-custom": "1"})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0")[0], np.arange(16) * 2)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1")[0], np.zeros(16))


def test_errors_match_the_grpcio_transport(models, toy_server) -> None:  # type: ignore[no-untyped-def]
    answers = []
    for options in (GrpcOptions(), _native()):
        server = toy_server(grpc_options=options)
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            bad = grpcclient.InferInput("INPUT0", [3], "INT32")
            bad.set_data_from_numpy(np.zeros(3, np.int32))
            answers.append([
                _error(lambda: client.get_model_metadata("missing")),
                _error(lambda: client.infer("missing", _add_sub_inputs(grpcclient))),
                _error(lambda: client.infer("add_sub", [bad])),
                _error(lambda: client.infer("repeat", [bad])),
            ])
    assert answers[0] == answers[1]
    assert answers[1][0][0] == "StatusCode.NOT_FOUND"


def test_large_messages_and_compression(models, toy_server) -> None:  # type: ignore[no-untyped-def]
    """4 MiB each way: beyond every window and frame size, so flow control and frame splitting work;
    gzip requests are decompressed and responses compressed when a level is set."""
    server = toy_server(grpc_options=_native(infer_response_compression_level="high"))
    data = np.random.default_rng(1).random(1 << 20, dtype=np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for algorithm in (None, "gzip", "deflate"):
            result = client.infer("identity", _identity_input(data), compression_algorithm=algorithm)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_message_size_limit(models, toy_server) -> None:  # type: ignore[no-untyped-def]
    server = toy_server(grpc_options=_native(max_message_size=1024))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        code, message = _error(lambda: client.infer("identity", _identity_input(np.zeros(1024, np.float32))))
        assert code == "StatusCode.RESOURCE_EXHAUSTED" and "Received message larger than max" in message
        assert client.is_server_live()


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_a_compressed_message_too_large_once_inflated(models, toy_server,  # type: ignore[no-untyped-def]
                                                       transport) -> None:
    """16 KiB of zeros compress far below the 4 KiB limit: both transports refuse them once inflated, alike."""
    server = toy_server(grpc_options=GrpcOptions(transport=transport, max_message_size=4096))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for algorithm in ("gzip", "deflate"):
            assert _error(lambda: client.infer("identity", _identity_input(np.zeros(4096, np.float32)),
                                               compression_algorithm=algorithm)) \
                == ("StatusCode.RESOURCE_EXHAUSTED", "Decompressed message larger than max")


_PROBE_OUTPUT = [grpcclient.InferRequestedOutput("OUTPUT0")]  # the others hold as many rows, in INT64


def _probe_input(seconds: float) -> list[grpcclient.InferInput]:
    """40 KB that gzip makes a few hundred bytes: the probe model sleeps ``seconds`` (the largest element)."""
    data = np.zeros(10_000, np.float32)
    data[0] = seconds
    tensor = grpcclient.InferInput("INPUT0", [data.size], "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor]


def test_compressed_messages_held_at_once_inflate_to_one_maximum_message(models,  # type: ignore[no-untyped-def]
                                                                         toy_server) -> None:
    """Two 40 KB messages do not fit in one of 64 KiB: the second one inflated while the first is held fails its
    call. A unary call's message is given back when the call ends, a stream's when its request is answered, and
    every one a failed stream holds when the stream ends."""
    server = toy_server(grpc_options=_native(max_message_size=64 * 1024))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for _ in range(3):
            client.infer("probe", _probe_input(0.0), outputs=_PROBE_OUTPUT, compression_algorithm="gzip")
        responses: queue.Queue = queue.Queue()
        client.start_stream(lambda result, error: responses.put((result, error)), compression_algorithm="gzip")
        for _ in range(3):  # one at a time: each is given back once answered
            client.async_stream_infer("probe", _probe_input(0.0), outputs=_PROBE_OUTPUT)
            result, error = responses.get(timeout=10)
            assert error is None and result.as_numpy("OUTPUT0").shape == (10_000,)
        client.async_stream_infer("probe", _probe_input(2.0), outputs=_PROBE_OUTPUT)  # held while it sleeps
        client.async_stream_infer("probe", _probe_input(0.0), outputs=_PROBE_OUTPUT)
        _result, error = responses.get(timeout=10)
        assert str(error.status()) == "StatusCode.RESOURCE_EXHAUSTED"
        assert error.message() == ("Decompressed messages in flight would exceed the server's limit (65536 bytes); "
                                   "retry when fewer are in flight")
        client.stop_stream()
        zeros = np.zeros(10_000, np.float32)  # the probe still sleeps: another model, as large
        result = client.infer("identity", _identity_input(zeros), compression_algorithm="gzip")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), zeros)  # the failed stream gave back its own


def test_decoupled_stream_ends(server) -> None:  # type: ignore[no-untyped-def]
    responses: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: responses.put((result, error)))
        count = grpcclient.InferInput("INPUT0", [1], "INT32")
        count.set_data_from_numpy(np.array([3], np.int32))
        client.async_stream_infer("repeat", [count], enable_empty_final_response=True)
        got = []
        while True:
            result, error = responses.get(timeout=10)
            assert error is None
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            got.append(int(result.as_numpy("OUTPUT0")[0]))
        client.stop_stream()  # half-closes; the server ends the call with trailers
    assert got == [0, 1, 2]


def test_deadline_exceeded(server) -> None:  # type: ignore[no-untyped-def]
    slow = grpcclient.InferInput("INPUT0", [1], "FP32")
    slow.set_data_from_numpy(np.array([1.0], np.float32))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        code, _message = _error(lambda: client.infer("probe", [slow], client_timeout=0.2))
        assert code == "StatusCode.DEADLINE_EXCEEDED"
        assert client.is_server_live()


def test_concurrent_aio_calls_and_aio_stream(server) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        async with aioclient.InferenceServerClient(server.grpc_url) as client:
            results = await asyncio.gather(*(client.infer("add_sub", _add_sub_inputs(aioclient)) for _ in range(64)))
            for result in results:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0")[0], np.arange(16) * 2)

            async def requests():  # type: ignore[no-untyped-def]
                count = aioclient.InferInput("INPUT0", [1], "INT32")
                count.set_data_from_numpy(np.array([2], np.int32))
                yield {"model_name": "repeat", "inputs": [count]}
            got = [int(result.as_numpy("OUTPUT0")[0]) async for result, error in client.stream_infer(requests())]
            assert got == [0, 1]
    asyncio.run(asyncio.wait_for(run(), 30))


def test_restricted_protocol_and_health(models, toy_server) -> None:  # type: ignore[no-untyped-def]
    restrictions = parse_restrictions("--grpc-restricted-protocol", ["model-config:admin-key=secret"],
                                      kind="protocol", header_prefix=GRPC_HEADER_PREFIX)
    server = toy_server(grpc_options=_native(), grpc_restricted_protocol=restrictions)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert _error(lambda: client.get_model_config("add_sub")) == (
            "StatusCode.UNAVAILABLE", f"This protocol is restricted, expecting header '{GRPC_HEADER_PREFIX}admin-key'")
        config = client.get_model_config("add_sub", headers={f"{GRPC_HEADER_PREFIX}admin-key": "secret"})
        assert config.config.name == "add_sub"
    with grpc.insecure_channel(server.grpc_url) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")(b"", timeout=10)  # type: ignore[arg-type]
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def _goaway_code(port: int, payload: bytes) -> int:
    """Send ``payload`` on a fresh connection; the GOAWAY error code the server answers with before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(payload)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    offset = 0
    while offset + 9 <= len(received):
        length_kind, _flags, _stream = struct.unpack_from(">IBI", received, offset)
        length, kind = length_kind >> 8, length_kind & 0xFF
        if kind == h2.GOAWAY:
            return int(struct.unpack_from(">I", received, offset + 13)[0])
        offset += 9 + length
    raise AssertionError(f"no GOAWAY in {received!r}")


def test_bad_bytes_end_only_their_connection(server) -> None:  # type: ignore[no-untyped-def]
    port = server.options.grpc_port
    settings = h2.frame(h2.SETTINGS, 0, 0)
    assert _goaway_code(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == h2.PROTOCOL_ERROR
    assert _goaway_code(port, h2.PREFACE + settings + h2.frame(h2.DATA, 0, 0, b"x")) == h2.PROTOCOL_ERROR
    oversized = struct.pack(">IBI", (h2.OUR_MAX_FRAME + 1) << 8 | h2.DATA, 0, 1) + bytes(h2.OUR_MAX_FRAME + 1)
    assert _goaway_code(port, h2.PREFACE + settings + oversized) == h2.FRAME_SIZE_ERROR
    assert _goaway_code(port, h2.PREFACE + settings + h2.frame(h2.HEADERS, 5, 1, b"\xff\xff\xff")) \
        == h2.COMPRESSION_ERROR
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_ready()


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_tls_on_either_transport(models, toy_server, certificates, transport) -> None:  # type: ignore[no-untyped-def]
    """TLS is served by the native transport (ALPN h2) as by grpcio, which stays selectable."""
    server = toy_server(grpc_options=GrpcOptions(transport=transport, use_ssl=True,
                                                 server_cert=certificates["server_cert"],
                                                 server_key=certificates["server_key"]))
    with grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=certificates["ca"]) as client:
        result = client.infer("add_sub", _add_sub_inputs(grpcclient))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0")[0], np.arange(16) * 2)
    context = ssl.create_default_context(cafile=certificates["ca"])
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", server.options.grpc_port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        assert sock.selected_alpn_protocol() == "h2"
        sock.sendall(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0))
        head = sock.recv(9)
        settings = sock.recv(struct.unpack(">I", b"\x00" + head[:3])[0])
    ours = struct.pack(">HI", h2.SETTINGS_MAX_CONCURRENT_STREAMS, h2.MAX_CONCURRENT_STREAMS) in settings
    assert ours == (transport == "native")  # the native transport served it, or grpcio when asked


def _raw_call(port: int, path: str, message: bytes, headers: list[tuple[str, str]]) -> tuple[list[tuple[int, int, int, bytes]], bytes]:
    """A gRPC call from a client with HTTP/2's default settings (65,535-byte windows, 16 KiB frames), giving
    credit only once the first window is used up: the frames received, and the response message's bytes."""
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                    (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers"),
                                    *headers])
    body = b"\x00" + len(message).to_bytes(4, "big") + message
    out = h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0) + h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, 1, block)
    out += b"".join(h2.frame(h2.DATA, 0, 1, body[i:i + 16384]) for i in range(0, len(body), 16384))
    out += h2.frame(h2.DATA, h2.FLAG_END_STREAM, 1)
    frames: list[tuple[int, int, int, bytes]] = []
    data = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(out)
        buffer, credited = b"", False
        while True:
            while len(buffer) >= 9:
                length_kind, flags, stream = struct.unpack_from(">IBI", buffer)
                if len(buffer) < 9 + (length_kind >> 8):
                    break
                kind, payload = length_kind & 0xFF, buffer[9:9 + (length_kind >> 8)]
                buffer = buffer[9 + len(payload):]
                frames.append((kind, flags, stream, payload))
                if kind == h2.DATA:
                    data += payload
                    assert credited or len(data) <= 65535, "sent beyond the peer's window"
                    if len(data) == 65535 and not credited:  # the whole first window: now give credit
                        credited = True
                        sock.sendall(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30))
                                     + h2.frame(h2.WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 30)))
                if kind == h2.HEADERS and flags & h2.FLAG_END_STREAM:
                    return frames, bytes(data)
            chunk = sock.recv(1 << 20)
            assert chunk, "connection closed before the call ended"
            buffer += chunk


def test_flow_control_frame_size_and_response_compression(models, toy_server) -> None:  # type: ignore[no-untyped-def]
    server = toy_server(grpc_options=_native(infer_response_compression_level="low"))
    data = np.arange(100_000, dtype=np.float32)
    request = pb.ModelInferRequest(model_name="identity", raw_input_contents=[data.tobytes()])
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[data.size])
    path = "/inference.GRPCInferenceService/ModelInfer"
    frames, body = _raw_call(server.options.grpc_port, path, request.SerializeToString(), [])
    sizes = [len(payload) for kind, _flags, _stream, payload in frames if kind == h2.DATA]
    assert max(sizes) <= 16384 and sum(sizes) > 65535  # split at the frame size, paused at the window
    assert body[0] == 0  # not compressed: the client accepts no compression
    response = pb.ModelInferResponse.FromString(body[5:])
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), data)
    _frames, body = _raw_call(server.options.grpc_port, path, request.SerializeToString(),
                              [("grpc-accept-encoding", "identity,gzip")])
    assert body[0] == 1
    response = pb.ModelInferResponse.FromString(gzip.decompress(body[5:]))
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), data)


def test_the_server_ends_a_call_past_its_grpc_timeout(server) -> None:  # type: ignore[no-untyped-def]
    """grpc-timeout is the server's deadline too: DEADLINE_EXCEEDED in trailers-only, whatever the client does."""
    request = pb.ModelInferRequest(model_name="probe", raw_input_contents=[np.array([2.0], np.float32).tobytes()])
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    frames, body = _raw_call(server.options.grpc_port, "/inference.GRPCInferenceService/ModelInfer",
                             request.SerializeToString(), [("grpc-timeout", "200m")])
    assert body == b""
    trailers = dict(hpack.Decoder().decode(frames[-1][3], raw=True))
    assert (trailers[b"grpc-status"], trailers[b"grpc-message"]) == (b"4", b"Deadline Exceeded")


def test_a_remembered_header_block_means_what_the_table_says_now() -> None:
    """A block of indexed fields is decoded once per table state: once a block changes the table, the same bytes
    are decoded again (here they then mean other headers)."""
    encoder, decoder = hpack.Encoder(), HeaderDecoder()
    first = [(":path", "/a"), ("x-one", "1")]
    second = [(":path", "/b"), ("x-two", "2")]
    assert decoder.decode(encoder.encode(first))[0] == first  # literals: the table grows
    repeated = encoder.encode(first)
    assert decoder.decode(repeated)[0] == first and decoder.decode(repeated)[0] is decoder.decode(repeated)[0]
    assert decoder.decode(encoder.encode(second))[0] == second  # new entries: every earlier index moves
    again = encoder.encode(second)
    assert again == repeated  # the same bytes ...
    assert decoder.decode(again)[0] == second  # ... now mean the second headers
