"""Inference over HTTP with tritonclient: every datatype as JSON and binary, and the protocol extras."""
from __future__ import annotations

import asyncio
import http.client
import json
import struct
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from .conftest import ADD_SUB, FRONTEND_MODES, DATATYPES, every_datatype_config


@pytest.fixture(params=FRONTEND_MODES, ids=lambda count: f"frontend_processes={count}")
def frontend_processes(request: pytest.FixtureRequest) -> int:
    """Every test here runs with in-process front-ends and with two front-end processes."""
    return int(request.param)


@pytest.fixture(params=["uvicorn", "hypercorn"], ids=lambda name: f"http_server={name}")
def http_server(request: pytest.FixtureRequest) -> str:
    """...and under both HTTP servers."""
    return str(request.param)


@pytest.fixture
def client(add_model, toy_server):  # type: ignore[no-untyped-def]
    add_model("every_type", every_datatype_config())
    add_model("add_sub", ADD_SUB)
    add_model("labels", 'backend: "toy_identity"\nmax_batch_size: 2\n'
              'input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }\n'
              'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" }',
              files={"labels.txt": "cat\ndog\nbird\nfish\n"})
    add_model("wide", 'backend: "toy_identity"\n'
              'input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }\n'
              'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }')
    server = toy_server()
    return httpclient.InferenceServerClient(server.http_url)


def _roundtrip(client: httpclient.InferenceServerClient, datatype: str, binary: bool) -> np.ndarray:
    tensor = httpclient.InferInput(f"INPUT_{datatype}", [3], datatype)
    tensor.set_data_from_numpy(DATATYPES[datatype], binary_data=binary)
    output = httpclient.InferRequestedOutput(f"OUTPUT_{datatype}", binary_data=binary)
    result = client.infer("every_type", [tensor], outputs=[output])
    assert result.get_output(f"OUTPUT_{datatype}")["datatype"] == datatype
    return result.as_numpy(f"OUTPUT_{datatype}")


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_binary(client, datatype: str) -> None:  # type: ignore[no-untyped-def]
    got = _roundtrip(client, datatype, binary=True)
    assert got.tolist() == DATATYPES[datatype].tolist()


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d not in ("FP16", "BF16")])
def test_every_datatype_json(client, datatype: str) -> None:  # type: ignore[no-untyped-def]
    got = _roundtrip(client, datatype, binary=False)
    expected = DATATYPES[datatype]
    if datatype == "BYTES":
        assert [x.encode() if isinstance(x, str) else x for x in got.tolist()] == expected.tolist()
    else:
        assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_is_refused(client, datatype: str) -> None:  # type: ignore[no-untyped-def]
    body = {"inputs": [{"name": f"INPUT_{datatype}", "datatype": datatype, "shape": [1], "data": [1.0]}]}
    raw = httpx.post(f"http://{client._parsed_url.netloc}/v2/models/every_type/infer", json=body)
    assert raw.status_code == 400
    assert raw.json()["error"] == (f"receiving {datatype} data via JSON is not supported. "
                                   f"Please use the binary data format for input INPUT_{datatype}")


def _add_sub_inputs(binary: bool = True) -> tuple[list[httpclient.InferInput], np.ndarray, np.ndarray]:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [2, 16], "INT32"), httpclient.InferInput("INPUT1", [2, 16], "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs, a, b


def test_add_sub_batch_with_id_and_requested_output(client) -> None:  # type: ignore[no-untyped-def]
    inputs, a, b = _add_sub_inputs()
    result = client.infer("add_sub", inputs, request_id="req-7",
                          outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    response = result.get_response()
    assert response["id"] == "req-7" and response["model_version"] == "1"
    assert [o["name"] for o in response["outputs"]] == ["OUTPUT1"]
    assert (result.as_numpy("OUTPUT1") == a - b).all()


def test_compressed_requests_and_responses(client) -> None:  # type: ignore[no-untyped-def]
    inputs, a, b = _add_sub_inputs()
    for request_algo, response_algo in (("gzip", "deflate"), ("deflate", "gzip")):
        result = client.infer("add_sub", inputs, request_compression_algorithm=request_algo,
                              response_compression_algorithm=response_algo)
        assert (result.as_numpy("OUTPUT0") == a + b).all()


def test_response_is_compressed_on_request(client) -> None:  # type: ignore[no-untyped-def]
    body = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                       for n in ("INPUT0", "INPUT1")]}
    raw = httpx.post(f"http://{client._parsed_url.netloc}/v2/models/add_sub/infer", json=body,
                     headers={"Accept-Encoding": "gzip"})
    assert raw.headers["content-encoding"] == "gzip"
    assert raw.json()["outputs"][0]["data"] == [2 * i for i in range(16)]  # httpx decompressed it


def test_classification_extension(client) -> None:  # type: ignore[no-untyped-def]
    tensor = httpclient.InferInput("INPUT0", [2, 4], "FP32")
    tensor.set_data_from_numpy(np.array([[0.1, 0.7, 0.2, 0.0], [0.9, 0.05, 0.03, 0.02]], dtype=np.float32))
    result = client.infer("labels", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    got = [[x.decode() if isinstance(x, bytes) else x for x in row] for row in result.as_numpy("OUTPUT0").tolist()]
    assert got == [["0.700000:1:dog", "0.200000:2:bird"], ["0.900000:0:cat", "0.050000:1:dog"]]


def test_classification_of_over_a_million_elements_is_refused(client) -> None:  # type: ignore[no-untyped-def]
    def top(count: int) -> httpclient.InferResult:  # Triton 2.66 bounds one output (batch entry) at 1,000,000
        tensor = httpclient.InferInput("INPUT0", [count], "FP32")
        tensor.set_data_from_numpy(np.arange(count, dtype=np.float32))
        return client.infer("wide", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=1)])
    (best,) = top(1_000_000).as_numpy("OUTPUT0").tolist()
    assert (best.decode() if isinstance(best, bytes) else best) == "999999.000000:999999"
    with pytest.raises(InferenceServerException, match="classification output tensor too large") as error:
        top(1_000_001)
    assert error.value.status() == "400"


def test_raw_binary_request(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("single", 'backend: "toy_identity"\nmax_batch_size: 4\n'
              'input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }\n'
              'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }')
    server = toy_server()
    data = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    raw = httpx.post(f"http://{server.http_url}/v2/models/single/infer", content=data.tobytes(),
                     headers={"Inference-Header-Content-Length": "0"})
    assert raw.status_code == 200, raw.text
    header_length = int(raw.headers["inference-header-content-length"])
    header = json.loads(raw.content[:header_length])
    assert header["outputs"][0]["shape"] == [1, 3]
    assert np.frombuffer(raw.content[header_length:], dtype=np.float32).tolist() == [1.0, 2.0, 3.0]


def test_raw_binary_request_with_a_chunked_body(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    """Transfer-Encoding: chunked, the chunks apart in time, through a real socket: the same answer as with
    Content-Length."""
    add_model("single", 'backend: "toy_identity"\nmax_batch_size: 4\n'
              'input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }\n'
              'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }')
    host, port = toy_server().http_url.rsplit(":", 1)
    data = np.arange(6, dtype=np.float32).tobytes()

    def pieces() -> Iterator[bytes]:
        yield data[:5]  # not a whole element
        time.sleep(0.05)
        yield data[5:]

    def post(chunked: bool) -> tuple[int, str | None, bytes]:
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            connection.request("POST", "/v2/models/single/infer", body=pieces() if chunked else data,
                               headers={"Inference-Header-Content-Length": "0"}, encode_chunked=chunked)
            response = connection.getresponse()
            return response.status, response.getheader("inference-header-content-length"), response.read()
        finally:
            connection.close()

    status, header_length, body = post(chunked=True)
    assert status == 200, body
    assert (status, header_length, body) == post(chunked=False)
    header = json.loads(body[:int(header_length or 0)])
    assert header["outputs"][0]["shape"] == [1, 6]
    assert np.frombuffer(body[len(body) - len(data):], dtype=np.float32).tolist() == list(range(6))


def test_binary_bytes_layout_is_length_prefixed(client) -> None:  # type: ignore[no-untyped-def]
    blob = b"".join(struct.pack("<I", len(x)) + x for x in (b"ab", b"c"))
    header = json.dumps({"inputs": [{"name": "INPUT_BYTES", "datatype": "BYTES", "shape": [2],
                                     "parameters": {"binary_data_size": len(blob)}}],
                         "outputs": [{"name": "OUTPUT_BYTES", "parameters": {"binary_data": True}}]}).encode()
    raw = httpx.post(f"http://{client._parsed_url.netloc}/v2/models/every_type/infer", content=header + blob,
                     headers={"Inference-Header-Content-Length": str(len(header))})
    length = int(raw.headers["inference-header-content-length"])
    assert raw.headers["content-type"] == "application/octet-stream"
    assert raw.content[length:] == blob


def test_aio_client(client) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        aio = aioclient.InferenceServerClient(client._parsed_url.netloc)
        try:
            assert await aio.is_server_live() and await aio.is_server_ready()
            assert (await aio.get_server_metadata())["name"] == "triton"
            assert (await aio.get_model_config("add_sub"))["max_batch_size"] == 8
            inputs, a, b = _add_sub_inputs()
            results = await asyncio.gather(*(aio.infer("add_sub", inputs) for _ in range(8)))
            assert all((r.as_numpy("OUTPUT0") == a + b).all() for r in results)
        finally:
            await aio.close()

    asyncio.run(run())


def test_metadata_and_config(client) -> None:  # type: ignore[no-untyped-def]
    metadata = client.get_server_metadata()
    assert metadata["name"] == "triton"
    assert {"model_repository", "model_configuration", "binary_tensor_data", "classification"} <= \
        set(metadata["extensions"])
    model = client.get_model_metadata("add_sub")
    assert model == {"name": "add_sub", "versions": ["1"], "platform": "toy_add_sub",
                     "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
                                {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]}],
                     "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
                                 {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]}]}
    assert client.get_model_metadata("add_sub", "1") == model
    config = client.get_model_config("add_sub")
    assert config["name"] == "add_sub" and config["input"][0]["dims"] == [16]
