"""``POST .../infer`` answered straight from the HTTP parser (http/infer_protocol.py) keeps HTTP/1.1's rules:
pipelined requests answered in order (mixed with requests the ASGI app answers), Connection: close and
HTTP/1.0, chunked and compressed bodies, the input-size limit, and the same answers as the ASGI path."""
from __future__ import annotations

import gzip
import json
import socket
import struct

import numpy as np
import pytest

from .conftest import ADD_SUB, FRONTEND_MODES


@pytest.fixture(params=FRONTEND_MODES)
def frontend_processes(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def server(add_model, toy_server):  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    return toy_server(http_max_input_size=4096)


def _infer_body(a: list[int], b: list[int]) -> bytes:
    blobs = struct.pack(f"<{len(a)}i", *a) + struct.pack(f"<{len(b)}i", *b)
    header = json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, len(a)], "parameters": {"binary_data_size": 4 * len(a)}},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, len(b)], "parameters": {"binary_data_size": 4 * len(b)}},
    ], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    return header + blobs, len(header)  # type: ignore[return-value]


def _infer_request(a: list[int], b: list[int], *, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    body, header_length = _infer_body(a, b)  # type: ignore[misc]
    return (b"POST /v2/models/add_sub/infer HTTP/" + version + b"\r\nHost: x\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n" % (header_length, len(body))
            + extra + b"\r\n" + body)


def _read_responses(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` responses (status, headers, body), each framed by its Content-Length."""
    buffer = b""
    answers = []
    sock.settimeout(10)
    while len(answers) < count:
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(answers)} of {count} responses"
            buffer += chunk
        head, buffer = buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers["content-length"])
        while len(buffer) < length:
            chunk = sock.recv(65536)
            assert chunk, "connection closed inside a body"
            buffer += chunk
        answers.append((int(lines[0].split()[1]), headers, buffer[:length]))
        buffer = buffer[length:]
    return answers


def _output0(headers: dict[str, str], body: bytes) -> list[int]:
    header_length = int(headers["inference-header-content-length"])
    doc = json.loads(body[:header_length])
    assert doc["outputs"][0]["name"] == "OUTPUT0" and doc["model_name"] == "add_sub"
    return list(np.frombuffer(body[header_length:], dtype="<i4"))


def _connect(server) -> socket.socket:  # type: ignore[no-untyped-def]
    return socket.create_connection(("127.0.0.1", server.options.http_port))


def test_pipelined_requests_are_answered_in_order_with_asgi_ones_between(server) -> None:  # type: ignore[no-untyped-def]
    a, b = list(range(16)), [1] * 16
    with _connect(server) as sock:
        sock.sendall(_infer_request(a, b) + b"GET /v2/models/add_sub/ready HTTP/1.1\r\nHost: x\r\n\r\n"
                     + _infer_request(b, b) + _infer_request([7] * 16, a))
        answers = _read_responses(sock, 4)
        assert [status for status, _, _ in answers] == [200, 200, 200, 200]
        assert _output0(answers[0][1], answers[0][2]) == [x + 1 for x in a]
        assert answers[1][2] == b""  # the readiness answer, in its place
        assert _output0(answers[2][1], answers[2][2]) == [2] * 16
        assert _output0(answers[3][1], answers[3][2]) == [7 + x for x in a]
        sock.sendall(_infer_request(a, a))  # the connection stays open for more
        (status, headers, body), = _read_responses(sock, 1)
        assert status == 200 and _output0(headers, body) == [2 * x for x in a]


@pytest.mark.parametrize("version, extra", [(b"1.1", b"Connection: close\r\n"), (b"1.0", b"")])
def test_a_request_that_closes_the_connection_is_answered_then_closed(server, version, extra) -> None:  # type: ignore[no-untyped-def]
    with _connect(server) as sock:
        sock.sendall(_infer_request([1] * 16, [2] * 16, extra=extra, version=version))
        (status, headers, body), = _read_responses(sock, 1)
        assert status == 200 and headers["connection"] == "close" and _output0(headers, body) == [3] * 16
        sock.settimeout(10)
        assert sock.recv(1) == b""  # the server closed it


def test_chunked_and_gzip_bodies_are_read_as_content_length_ones(server) -> None:  # type: ignore[no-untyped-def]
    body, header_length = _infer_body([5] * 16, [1] * 16)  # type: ignore[misc]
    packed = gzip.compress(body)
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (packed[:10], packed[10:])) + b"0\r\n\r\n"
    with _connect(server) as sock:
        sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Encoding: gzip\r\nAccept-Encoding: gzip\r\n"
                     b"Inference-Header-Content-Length: %d\r\n\r\n" % header_length + chunked)
        (status, headers, answer), = _read_responses(sock, 1)
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert _output0(headers, gzip.decompress(answer)) == [6] * 16


def test_errors_on_the_fast_path_are_tritons_json_with_its_status(server) -> None:  # type: ignore[no-untyped-def]
    big = list(range(600))  # 4.8 KB of inputs, over the server's 4096-byte limit
    with _connect(server) as sock:
        sock.sendall(_infer_request([1], [1]).replace(b"add_sub", b"nope", 1) + _infer_request(big, big)
                     + b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{nope"
                     + _infer_request([1] * 8, [1] * 8))
        answers = _read_responses(sock, 4)
    statuses = [status for status, _, _ in answers]
    errors = [json.loads(body)["error"] for _, _, body in answers]
    assert statuses == [404, 400, 400, 400], errors
    assert "unknown model" in errors[0] and "'nope'" in errors[0]
    assert "exceeds the maximum input size of 4096 bytes" in errors[1]
    assert errors[2].startswith("failed to parse the request JSON buffer")
    assert "unexpected shape for input 'INPUT0'" in errors[3]


IDENTITY_FP32 = """
backend: "toy_identity"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
"""


@pytest.mark.parametrize("http_server", ["uvicorn", "hypercorn"])
def test_a_raw_binary_body_in_chunks_is_served_with_or_without_a_content_length(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    """Triton's test_content_encoding_chunked_manually: ``requests`` sends the chunked body with a Content-Length
    too. The chunks decide the body; a request framed both ways is answered, then its connection closed."""
    add_model("add_sub", ADD_SUB)
    add_model("identity_fp32", IDENTITY_FP32)
    server = toy_server()
    data = np.arange(8, dtype=np.float32).tobytes()
    chunked = b"%X\r\n%s\r\n%X\r\n%s\r\n0\r\n\r\n" % (5, data[:5], len(data) - 5, data[5:])
    head = (b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: 0\r\n"
            b"Transfer-Encoding: chunked\r\n")
    with _connect(server) as sock:
        for part in (head + b"\r\n", chunked[:9], chunked[9:]):  # the request arrives in pieces
            sock.sendall(part)
        (status, headers, body), = _read_responses(sock, 1)
        assert status == 200, body
        assert body[int(headers["inference-header-content-length"]):] == data
        sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(chunked) + chunked
                     + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")  # not answered: the connection closes
        (status, headers, body), = _read_responses(sock, 1)
        assert status == 200, body
        assert body[int(headers["inference-header-content-length"]):] == data
        sock.settimeout(10)
        assert sock.recv(65536) == b""
    json_body, header_length = _infer_body([2] * 16, [3] * 16)  # type: ignore[misc]
    chunked = b"%X\r\n%s\r\n0\r\n\r\n" % (len(json_body), json_body)
    with _connect(server) as sock:  # the same for a request the fast path answers
        sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (header_length, len(chunked))
                     + chunked)
        (status, headers, body), = _read_responses(sock, 1)
        assert status == 200 and _output0(headers, body) == [5] * 16
        sock.settimeout(10)
        assert sock.recv(65536) == b""
