"""The native gRPC transport under abusive clients: raw sockets that never read, flood cheap frames or send a
gzip bomb. Each flood must leave the server's memory within 64 MiB of growth, end the abusive connection, and
leave other clients' calls answering (their latency is printed, not asserted: this machine's timings are noisy).
The server runs in this process, so the memory measured is this process's resident set."""
from __future__ import annotations

import select
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from triton_serve._engine.frontend.grpc import h2
from triton_serve._engine.frontend.grpc.server import GrpcOptions
from triton_serve._engine.protos import grpc_service_pb2 as pb
from triton_serve._engine.server import ServerOptions
from triton_serve.testing import RunningServer, ToyBackendsPlugin, free_port

from .conftest import ADD_SUB, write_model

IDENTITY = """
backend: "toy_identity"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
"""
MAX_MESSAGE = 4 << 20  # the server's maximum message size: the gzip bomb inflates far past it
GROWTH_LIMIT = 64 << 20
SEND_TIMEOUT = 3.0  # the server aborts a connection whose peer reads nothing for this long
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


# ---- a raw HTTP/2 client ---------------------------------------------------------------------

Frame = tuple[int, int, int, bytes]  # type, flags, stream id, payload


class RawClient:
    """One HTTP/2 connection from a socket: frames sent as built, frames received as parsed."""

    def __init__(self, port: int, settings: bytes = b"", timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.sendall(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0, settings))
        self.encoder = hpack.Encoder()
        self.received = b""

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def headers(self, path: str, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
        """A gRPC request's header block (the encoder's table grows as a client's would)."""
        return self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                    (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers"),
                                    *extra])

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frames(self, deadline: float) -> Iterator[Frame]:
        """Frames as they arrive, until the connection ends or ``deadline`` (time.monotonic()) passes."""
        buffer = b""
        while True:
            while len(buffer) >= 9:
                length_kind, flags, stream = struct.unpack_from(">IBI", buffer)
                length = length_kind >> 8
                if len(buffer) < 9 + length:
                    break
                yield length_kind & 0xFF, flags, stream & 0x7FFFFFFF, buffer[9:9 + length]
                buffer = buffer[9 + length:]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 20)
            except (TimeoutError, socket.timeout, ConnectionError):
                return
            if not chunk:
                return
            buffer += chunk

    def reset_by_server(self) -> bool:
        """Whether the server has aborted the connection, seen without reading anything."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(1000))

    def ended(self, timeout: float = 30.0) -> tuple[bool, int | None]:
        """Read until the server ends the connection: (whether it did within ``timeout``, GOAWAY's code if seen)."""
        deadline = time.monotonic() + timeout
        code = None
        for kind, _flags, _stream, payload in self.frames(deadline):
            if kind == h2.GOAWAY:
                code = struct.unpack_from(">I", payload, 4)[0]
        return time.monotonic() < deadline, code


def generous_client(port: int, timeout: float) -> RawClient:
    """A client that gives the server all the flow-control credit HTTP/2 allows (and then reads nothing)."""
    client = RawClient(port, struct.pack(">HI", h2.SETTINGS_INITIAL_WINDOW_SIZE, h2.MAX_WINDOW), timeout)
    client.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", h2.MAX_WINDOW - h2.DEFAULT_WINDOW)))
    return client


def data_frames(stream_id: int, body: bytes, end: bool) -> bytes:
    """``body`` as DATA frames of at most 16 KiB, END_STREAM on the last when ``end``."""
    chunks = [body[i:i + 16384] for i in range(0, len(body), 16384)] or [b""]
    return b"".join(h2.frame(h2.DATA, h2.FLAG_END_STREAM if end and i == len(chunks) - 1 else 0, stream_id, chunk)
                    for i, chunk in enumerate(chunks))


def grpc_message(message: bytes, compressed: bool = False) -> bytes:
    return bytes((int(compressed),)) + len(message).to_bytes(4, "big") + message


def identity_request(floats: int) -> bytes:
    data = np.zeros(floats, np.float32)
    request = pb.ModelInferRequest(model_name="identity", raw_input_contents=[data.tobytes()])
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[floats])
    return request.SerializeToString()


# ---- measuring -------------------------------------------------------------------------------

def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class Watch:
    """While open: the peak growth of this process's resident set, and the latency of another client's
    add_sub calls on their own connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.baseline = resident_bytes()
        self.peak = self.baseline
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sample, daemon=True),
                         threading.Thread(target=self._probe, daemon=True)]

    def __enter__(self) -> Watch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    @property
    def growth(self) -> int:
        return self.peak - self.baseline

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, resident_bytes())

    def _probe(self) -> None:
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
            inputs.append(tensor)
        with grpcclient.InferenceServerClient(self.url) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    client.infer("add_sub", inputs, client_timeout=30)
                except Exception as error:  # recorded: the test decides whether it matters
                    self.failures.append(str(error))
                else:
                    self.latencies.append(time.monotonic() - start)
                self._stop.wait(0.02)

    def report(self, name: str) -> str:
        latencies = sorted(self.latencies) or [float("nan")]
        line = (f"{name}: RSS growth {self.growth / 2**20:.1f} MiB; other client's calls: {len(self.latencies)} "
                f"answered, median {latencies[len(latencies) // 2] * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms, "
                f"{len(self.failures)} failed")
        print(line)
        return line


# ---- the server ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One native-transport server for the module, aborting non-reading peers after SEND_TIMEOUT seconds."""
    repo = tmp_path_factory.mktemp("h2_limits")
    write_model(repo, "add_sub", ADD_SUB)
    write_model(repo, "identity", IDENTITY)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(h2, "SEND_TIMEOUT", SEND_TIMEOUT)
        running = RunningServer(ServerOptions(
            model_repositories=[str(repo)], extra_plugins=[("toy", ToyBackendsPlugin())], http_port=free_port(),
            grpc_port=free_port(), metrics_port=free_port(), http_address="127.0.0.1", grpc_address="127.0.0.1",
            allow_metrics=False, frontend_processes=0,
            grpc_options=GrpcOptions(transport="native", max_message_size=MAX_MESSAGE)))
        yield running
        running.stop()


def _flood(port: int, chunk: bytes, limit: int, seconds: float) -> tuple[int, list[int | None]]:
    """Connections that send ``chunk`` over and over without reading, each until the server ends it or ``limit``
    bytes went out, for ``seconds``: the connections opened, and the GOAWAY code (or None) of each one the
    server ended."""
    opened, codes = 0, []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        opened += 1
        with RawClient(port, timeout=SEND_TIMEOUT * 3) as client:
            sent = 0
            try:
                while sent < limit:
                    client.send(chunk)
                    sent += len(chunk)
            except OSError:  # reset by the server, or it stopped reading and then went away
                pass
            ended, code = client.ended(timeout=SEND_TIMEOUT * 5)
            if not ended:
                break
            codes.append(code)
    return opened, codes


CONTROL_FLOODS = {
    "PING": h2.frame(h2.PING, 0, 0, b"12345678") * 4096,
    "SETTINGS": h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", h2.SETTINGS_ENABLE_PUSH, 0)) * 4096,
}


@pytest.mark.parametrize("kind", list(CONTROL_FLOODS))
def test_a_control_frame_flood_from_a_peer_that_never_reads(server: RunningServer, kind: str) -> None:
    """Each PING or SETTINGS asks for an acknowledgement; a peer that floods them and reads none must not
    make the server queue acknowledgements without bound: past grpc core's ping strikes or the budget per
    second, the connection ends with GOAWAY ENHANCE_YOUR_CALM."""
    with Watch(server.grpc_url) as watch:
        opened, codes = _flood(server.options.grpc_port, CONTROL_FLOODS[kind], 64 << 20, 2.0)
    watch.report(f"{kind} flood ({opened} connections)")
    assert len(codes) == opened, "a flooding connection stayed open"
    # the GOAWAY is lost where the server's close meets unread bytes (the peer gets a reset instead)
    assert h2.ENHANCE_YOUR_CALM in codes and set(codes) <= {h2.ENHANCE_YOUR_CALM, None}
    assert watch.growth < GROWTH_LIMIT


def test_streamed_requests_whose_responses_are_never_read(server: RunningServer) -> None:
    """32,000 ModelStreamInfer requests on one stream from a peer that gives credit but reads nothing: the
    server stops taking requests once its answers wait unread, and ends the connection; memory stays bounded."""
    message = grpc_message(identity_request(1024))
    with Watch(server.grpc_url) as watch, generous_client(server.options.grpc_port, SEND_TIMEOUT * 3) as client:
        client.send(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, 1, client.headers(STREAM_INFER)))
        batch = data_frames(1, message * 64, False)
        try:
            for _ in range(32_000 // 64):
                client.send(batch)
        except OSError:
            pass
        time.sleep(SEND_TIMEOUT + 2)  # still reading nothing
        aborted = client.reset_by_server()
    watch.report("32,000 unread streamed requests")
    assert aborted
    assert watch.growth < GROWTH_LIMIT


def test_unary_calls_whose_responses_are_never_read(server: RunningServer) -> None:
    """Up to 12,000 unary calls (12 KiB each way) from a peer that gives credit but reads nothing, 40 every
    0.1 s (within SETTINGS_MAX_CONCURRENT_STREAMS once the calls before have answered) until the server stops
    reading it (a send blocks for a second): the connection is aborted SEND_TIMEOUT later; memory stays bounded."""
    body = grpc_message(identity_request(3072))
    with Watch(server.grpc_url) as watch, generous_client(server.options.grpc_port, 1.0) as client:
        try:
            for wave in range(300):
                client.send(b"".join(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, stream_id, client.headers(INFER))
                                     + data_frames(stream_id, body, True)
                                     for stream_id in range(1 + 80 * wave, 80 * (wave + 1), 2)))
                time.sleep(0.1)
        except OSError:
            pass
        time.sleep(SEND_TIMEOUT + 2)  # still reading nothing
        aborted = client.reset_by_server()
    watch.report("12,000 unread unary calls")
    assert aborted
    assert watch.growth < GROWTH_LIMIT


def _open_stream(client: RawClient) -> bytes:
    return h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, 1, client.headers(INFER))


def _open_header_block(client: RawClient) -> bytes:
    return h2.frame(h2.HEADERS, 0, 1, client.headers(INFER))


EMPTY_FLOODS = {  # what opens the flood, and the frame repeated
    "empty DATA": (_open_stream, h2.frame(h2.DATA, 0, 1)),
    "zero-length CONTINUATION": (_open_header_block, h2.frame(h2.CONTINUATION, 0, 1)),
}


@pytest.mark.parametrize("kind", list(EMPTY_FLOODS))
def test_a_flood_of_empty_frames_ends_its_connection_and_others_keep_answering(server: RunningServer,
                                                                                kind: str) -> None:
    """Empty frames cost the server a frame header each and carry nothing: past a budget per second the
    connection ends, and while connections flood them another client's calls still answer."""
    opener, repeated = EMPTY_FLOODS[kind]
    port = server.options.grpc_port
    with Watch(server.grpc_url) as watch:
        opened = ended = 0
        stop = time.monotonic() + 3.0
        while time.monotonic() < stop:
            opened += 1
            with RawClient(port, timeout=SEND_TIMEOUT * 3) as client:
                try:
                    client.send(opener(client))
                    for _ in range(1000):
                        client.send(repeated * 8192)
                except OSError:
                    pass
                finished, code = client.ended()
                ended += finished
                if not finished:
                    break
                assert code in (None, h2.ENHANCE_YOUR_CALM)
        deadline = time.monotonic() + 30
        while not watch.latencies and time.monotonic() < deadline:
            time.sleep(0.05)
    watch.report(f"{kind} flood ({opened} connections)")
    assert ended == opened
    assert watch.latencies, f"no call of another client answered during the flood: {watch.failures[:1]}"


def test_a_gzip_bomb_is_refused_before_it_is_inflated(server: RunningServer) -> None:
    """1 MiB of gzip that inflates to 1 GiB: RESOURCE_EXHAUSTED once the maximum message size is passed,
    without inflating the rest."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    bomb = b"".join(compressor.compress(zeros) for _ in range(1024)) + compressor.flush()
    assert len(bomb) < 1100 << 10
    with Watch(server.grpc_url) as watch, RawClient(server.options.grpc_port) as client:
        client.send(h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, 1, client.headers(INFER, (("grpc-encoding", "gzip"),)))
                    + data_frames(1, grpc_message(bomb, compressed=True), True))
        trailers = None
        for kind, flags, stream, payload in client.frames(time.monotonic() + 60):
            if kind == h2.HEADERS and stream == 1 and flags & h2.FLAG_END_STREAM:
                trailers = dict(hpack.Decoder().decode(payload))
                break
    watch.report("gzip bomb (1 MiB -> 1 GiB)")
    assert trailers is not None, "no answer to the call"
    assert trailers["grpc-status"] == "8", trailers  # RESOURCE_EXHAUSTED
    assert trailers["grpc-message"] == "Decompressed message larger than max"  # grpcio's wording
    assert watch.growth < GROWTH_LIMIT
