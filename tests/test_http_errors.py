"""Bad HTTP input gets Triton's status and a message naming what is wrong; the server keeps serving."""
from __future__ import annotations

import gzip
import json
import queue
import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.testing import probe_config

from .conftest import ADD_SUB, FRONTEND_MODES


@pytest.fixture(params=FRONTEND_MODES, ids=lambda count: f"frontend_processes={count}")
def frontend_processes(request: pytest.FixtureRequest) -> int:
    """Every test here runs with in-process front-ends and with two front-end processes."""
    return int(request.param)


@pytest.fixture
def url(add_model, toy_server) -> str:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("failing", ADD_SUB.replace("toy_add_sub", "toy_error"))
    add_model("broken", ADD_SUB + 'parameters { key: "fail_load" value { string_value: "1" } }')
    add_model("stream", ADD_SUB.replace("toy_add_sub", "toy_repeat") + "model_transaction_policy { decoupled: true }")
    server = toy_server(http_max_input_size=4096)
    yield f"http://{server.http_url}"
    # whatever came before, the server still answers correctly
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    assert client.infer("add_sub", inputs).as_numpy("OUTPUT0").tolist() == [[2] * 16]


def tensor(name: str = "INPUT0", shape: list[int] | None = None, datatype: str = "INT32",
           data: object = None) -> dict[str, object]:
    shape = shape if shape is not None else [1, 16]
    count = int(np.prod(shape))
    return {"name": name, "datatype": datatype, "shape": shape, "data": data if data is not None else [1] * count}


def post(url: str, path: str, body: object = None, content: bytes | None = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    if content is None:
        content = json.dumps(body).encode()
    return httpx.post(url + path, content=content, headers=headers or {})


def assert_error(response: httpx.Response, status: int, message: str) -> None:
    assert response.status_code == status, response.text
    assert message in response.json()["error"]


JSON_CASES = [
    ({"inputs": [tensor(), tensor("INPUT1", [1, 15])]}, 400,
     "unexpected shape for input 'INPUT1' for model 'add_sub'. Expected [-1, 16], got [1, 15]"),
    ({"inputs": [tensor(), tensor("INPUT1", datatype="FP32", data=[1.0] * 16)]}, 400,
     "inference input 'INPUT1' data-type is 'FP32', but model 'add_sub' expects 'INT32'"),
    ({"inputs": [tensor()]}, 400, "missing required input(s) ['INPUT1']"),
    ({"inputs": [tensor(), tensor(), tensor("INPUT1")]}, 400, "input 'INPUT0' is specified more than once"),
    ({"inputs": [tensor(), tensor("INPUT1"), tensor("INPUT9")]}, 400,
     "unexpected inference input 'INPUT9' for model 'add_sub'"),
    ({"inputs": [tensor(shape=[9, 16]), tensor("INPUT1", [9, 16])]}, 400,
     "inference request batch-size must be <= 8 for 'add_sub'"),
    ({"inputs": [tensor(), tensor("INPUT1", data=[1] * 15)]}, 400, "Unable to parse 'data' of input 'INPUT1'"),
    ({"inputs": [tensor(), tensor("INPUT1", data=["x"] * 16)]}, 400, "INT32 elements must be numbers"),
    ({"inputs": [tensor(), tensor("INPUT1", shape=[1, -16])]}, 500,
     "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ({"inputs": [tensor(), tensor("INPUT1", datatype="FLOAT")]}, 400, "invalid datatype for input INPUT1"),
    ({"inputs": [tensor(), {**tensor("INPUT1", datatype="FLOAT"), "data": None,
                            "parameters": {"binary_data_size": 64}}]}, 400, "invalid datatype 'FLOAT' for input 'INPUT1'"),
    ({"inputs": [tensor(), {**tensor("INPUT1"), "parameters": {"binary_data_size": 64}}]}, 400,
     "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
     "'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'"),
    ({"inputs": [tensor(), {**tensor("INPUT1"), "data": None, "parameters": {"shared_memory_region": "r"}}]},
     404, "Unable to find shared memory region: 'r'"),
    ({"inputs": [tensor(), tensor("INPUT1")], "outputs": [{"name": "OUTPUT7"}]}, 400,
     "unexpected inference output 'OUTPUT7' for model 'add_sub'"),
    ({"inputs": [tensor(), tensor("INPUT1")], "parameters": {"triton_x": 1}}, 400,
     "parameter keys starting with 'triton_' are reserved"),
    # the parameters the server reads itself, read as Triton reads them (ParseJsonTritonParams), with its words
    ({"inputs": [tensor(), tensor("INPUT1")], "parameters": {"priority": "high"}}, 500,
     "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ({"inputs": [tensor(), tensor("INPUT1")], "parameters": {"timeout": 2**64}}, 500,
     "Unable to parse 'timeout': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ({"inputs": [tensor(), tensor("INPUT1")], "parameters": {"timeout": 1.5}}, 500,
     "Unable to parse 'timeout': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ({"inputs": [tensor(), tensor("INPUT1")], "parameters": {"sequence_id": -1}}, 500,
     "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
    ({"inputs": [tensor(), tensor("INPUT1")], "parameters": {"sequence_end": 1}}, 500,
     "Unable to parse 'sequence_end': attempt to access JSON non-boolean as boolean"),
    # Triton's JSON reader's words, and its status (500), for fields missing or of the wrong JSON type, read in
    # Triton's order: the id, the parameters, the inputs, the outputs
    ({"inputs": "nope"}, 500, "Unable to parse 'inputs': attempt to access JSON non-array as array"),
    ({"id": 7}, 500, "Unable to parse 'id': attempt to access JSON non-string as string"),
    ({"parameters": []}, 500, "failed to get request params.: attempt to get members for non-object"),
    ([tensor()], 500, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
    ({"inputs": [tensor(), {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16]}]}, 400,
     "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
     "'shared_memory_region' in 'parameters'. But no field is set"),
    ({"inputs": [tensor(), {"datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]}, 500,
     "Unable to parse 'name': attempt to access non-existing object member 'name'"),
    ({"inputs": [tensor(), {"name": "INPUT1", "datatype": "INT32", "shape": "1,16", "data": [1] * 16}]}, 500,
     "Unable to parse 'shape': attempt to access JSON non-array as array"),
    ({"inputs": [tensor(), tensor("INPUT1")], "outputs": [{"name": 0}]}, 500,
     "Unable to parse 'name': attempt to access JSON non-string as string"),
    # Triton's JSON reader's words, and its status (500), for values of the wrong JSON type
    ({"inputs": [tensor(), tensor("INPUT1")], "outputs": 5}, 500,
     "Unable to parse 'outputs': attempt to access JSON non-array as array"),
    ({"inputs": [tensor(), {**tensor("INPUT1"), "datatype": {"INT32": 1}}]}, 500,
     "Unable to parse 'datatype': attempt to access JSON non-string as string"),
    ({"inputs": [tensor(), tensor("INPUT1")], "parameters": {"options": {"a": 1}}}, 400,
     "parameter 'options' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"inputs": [tensor(), tensor("INPUT1")], "parameters": {"options": None}}, 400,
     "parameter 'options' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"inputs": [tensor(), tensor("INPUT1")], "parameters": {"binary_data_output": "yes"}}, 500,
     "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean"),
    ({"inputs": [tensor(), tensor("INPUT1", [1] * 65)]}, 400,
     "shape of input 'INPUT1' has 65 dims; at most 64 are supported"),
]


@pytest.mark.parametrize(("body", "status", "message"), JSON_CASES, ids=[c[2][:50] for c in JSON_CASES])
def test_bad_json_requests(url: str, body: object, status: int, message: str) -> None:
    if isinstance(body, dict) and isinstance(body.get("inputs"), list):  # "data": None means no data
        body = {**body, "inputs": [{k: v for k, v in item.items() if not (k == "data" and v is None)}
                                   for item in body["inputs"]]}
    assert_error(post(url, "/v2/models/add_sub/infer", body), status, message)


def test_tensor_parameters_that_are_not_objects_are_ignored_as_triton_ignores_them(url: str) -> None:
    body = {"inputs": [tensor(), {**tensor("INPUT1"), "parameters": [1]}],
            "outputs": [{"name": "OUTPUT0", "parameters": "binary_data"}]}
    response = post(url, "/v2/models/add_sub/infer", body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == [{"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": [2] * 16}]


def test_an_error_quoting_a_lone_surrogate_is_still_json(url: str) -> None:
    response = post(url, "/v2/trace/setting", content=b'{"trace_count": "\\ud800"}')
    assert_error(response, 400, "Unable to parse 'trace_count', got: \ud800")
    assert b"\\ud800" in response.content  # escaped: the body is ASCII


_INFER = "/v2/models/add_sub/infer"
_NAN_DATA = json.dumps({"inputs": [tensor(), tensor("INPUT1", datatype="INT32", data=[1] * 15 + [float("nan")])]})


@pytest.mark.parametrize(("path", "content", "status", "message"), [
    (_INFER, b'{"inputs": [', 400, "Expecting value: line 1 column 13 (char 12)"),
    (_INFER, b"  ", 400, "The document is empty. at 2"),
    (_INFER, _NAN_DATA.encode(), 400, f"Invalid value. at {_NAN_DATA.index('NaN')}"),
    (_INFER, _NAN_DATA.replace("NaN", "-Infinity").encode(), 400,
     f"Invalid value. at {_NAN_DATA.index('NaN') + 1}"),  # rapidjson's offset: after the sign
    ("/v2/repository/index", b'{"ready": Infinity}', 400, "Invalid value. at 10"),
    ("/v2/models/add_sub/generate", b'{"INPUT0": "NaN", "INPUT1": NaN}', 400, "Invalid value. at 28"),
    ("/v2/trace/setting", b" ", 500, "The document is empty. at 1"),
])
def test_json_that_does_not_parse_gets_rapidjsons_words_where_triton_has_them(
        url: str, path: str, content: bytes, status: int, message: str) -> None:
    """Triton's prefix everywhere; rapidjson's words for an empty document and for NaN and Infinity, which Python's
    json would read. An /infer header of a shape the server has already read goes through the same checks."""
    post(url, _INFER, content=_NAN_DATA.replace("NaN", "1").encode())  # kept: only its data is read next time
    response = post(url, path, content=content)
    assert_error(response, status, "failed to parse the request JSON buffer: " + message)


def binary_request(sizes: list[int], blob: bytes, header_length: str | None = None) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [
        {"name": f"INPUT{i}", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": size}}
        for i, size in enumerate(sizes)]}).encode()
    length = str(len(header)) if header_length is None else header_length
    return header + blob, {"Inference-Header-Content-Length": length}


@pytest.mark.parametrize(("sizes", "blob_size", "header_length", "message"), [
    ([64, 64], 64, None, "unexpected size for input 'INPUT1', expecting 64 additional bytes for model 'add_sub'"),
    ([64, 64], 192, None, "unexpected additional input data for model 'add_sub'"),
    ([64, 60], 124, None, "input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 64, got 60"),
    ([64, 64], 128, "-5", "inference header size should be in range (0, "),
    ([64, 64], 128, "999999", "inference header size should be in range (0, "),
    ([64, 64], 128, "abc", "Inference-Header-Content-Length must be an integer"),
])
def test_bad_binary_requests(url: str, sizes: list[int], blob_size: int, header_length: str | None,
                             message: str) -> None:
    content, headers = binary_request(sizes, bytes(blob_size), header_length)
    assert_error(post(url, "/v2/models/add_sub/infer", content=content, headers=headers), 400, message)


@pytest.mark.parametrize("path", ["/v2/models/add_sub/infer", "/v2/models/add%5Fsub/infer"],
                         ids=["answered-from-the-parser", "asgi-app"])  # a %-escape leaves it to the app
def test_the_first_of_a_repeated_header_is_the_one_read(url: str, path: str) -> None:
    content, headers = binary_request([64, 64], np.arange(32, dtype=np.int32).tobytes())
    length = headers["Inference-Header-Content-Length"]
    repeated = [("Inference-Header-Content-Length", length), ("Inference-Header-Content-Length", "abc")]
    response = httpx.post(url + path, content=content, headers=repeated)
    assert response.status_code == 200, response.text
    outputs = {output["name"]: output["data"] for output in response.json()["outputs"]}
    assert outputs["OUTPUT0"] == [i + 16 + i for i in range(16)]


def test_body_over_the_size_limit(url: str) -> None:
    assert_error(post(url, "/v2/models/add_sub/infer", content=b" " * 5000), 400,
                 "exceeds the maximum input size of 4096 bytes")
    bomb = gzip.compress(b" " * 100_000)
    assert_error(post(url, "/v2/models/add_sub/infer", content=bomb, headers={"Content-Encoding": "gzip"}), 400,
                 "exceeds the maximum input size")


@pytest.mark.parametrize(("body", "reason"), [
    (b"not gzip at all", "Error -3 while decompressing data: incorrect header check"),
    (gzip.compress(b'{"inputs": []}', mtime=0)[:-12], "incomplete data"),  # cut before the trailer
], ids=["corrupt", "truncated"])  # ids that do not change: every xdist worker must collect the same tests
def test_a_gzip_body_that_does_not_inflate_is_refused(url: str, body: bytes, reason: str) -> None:
    assert_error(post(url, "/v2/models/add_sub/infer", content=body, headers={"Content-Encoding": "gzip"}), 400,
                 f"failed to decompress the gzip request body: {reason}")


def _fp32_input(seconds: float = 0.0) -> list[httpclient.InferInput]:
    """40 KB that gzip makes a few hundred bytes; the probe model sleeps ``seconds`` (the largest element)."""
    data = np.zeros(10_000, np.float32)
    data[0] = seconds
    tensor = httpclient.InferInput("INPUT0", [data.size], "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor]


IDENTITY = """
backend: "toy_identity"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
"""


@pytest.mark.parametrize("frontend_processes", [0])  # the bound is per front-end process: one, for two clients
@pytest.mark.parametrize("http_server", ["uvicorn", "hypercorn"])  # the fast /infer path, and the ASGI one
def test_compressed_bodies_held_at_once_inflate_to_one_maximum_input_size(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    """Two 40 KB bodies do not fit in 64 KiB: while one sleeps in the probe model, another compressed body is
    refused; each is given back once answered, so the first and those after it are served."""
    add_model("probe", probe_config(max_batch_size=0))
    add_model("identity", IDENTITY)
    server = toy_server(http_max_input_size=64 * 1024)
    client = httpclient.InferenceServerClient(server.http_url)
    for _ in range(3):  # one at a time: each is given back once answered
        client.infer("identity", _fp32_input(), request_compression_algorithm="gzip")
    sleeper: queue.Queue[Any] = queue.Queue()

    def sleep_in_the_model() -> None:
        """The probe's request, sent again while one of the test's own holds its bytes (refused, 503)."""
        with httpclient.InferenceServerClient(server.http_url) as own:
            for _ in range(100):
                try:
                    sleeper.put(own.infer("probe", _fp32_input(3.0), outputs=[httpclient.InferRequestedOutput(
                        "OUTPUT0")], request_compression_algorithm="gzip"))
                    return
                except InferenceServerException as error:
                    if error.status() != "503":
                        sleeper.put(error)
                        return
            sleeper.put(None)

    thread = threading.Thread(target=sleep_in_the_model)
    thread.start()
    refused = None
    try:
        deadline = time.monotonic() + 30
        while refused is None and sleeper.empty() and time.monotonic() < deadline:
            try:
                client.infer("identity", _fp32_input(), request_compression_algorithm="gzip")
            except InferenceServerException as error:
                refused = error
    finally:
        thread.join(30)
    assert refused is not None, "a second compressed body was inflated while the first was held"
    assert refused.status() == "503"
    assert refused.message() == ("decompressed request bodies in flight would exceed the server's limit (65536 "
                                 "bytes, --http-max-input-size); retry when fewer are in flight")
    slept = sleeper.get(timeout=0)
    assert isinstance(slept, httpclient.InferResult), slept
    assert slept.as_numpy("OUTPUT0")[0] == 3.0
    zeros = client.infer("identity", _fp32_input(), request_compression_algorithm="gzip").as_numpy("OUTPUT0")
    assert zeros.shape == (10_000,) and not zeros.any()  # the sleeper gave its bytes back


def test_unknown_model_and_version(url: str) -> None:
    body = {"inputs": [tensor(), tensor("INPUT1")]}
    assert_error(post(url, "/v2/models/nope/infer", body), 404, "Request for unknown model: 'nope' is not found")
    assert_error(post(url, "/v2/models/add_sub/versions/3/infer", body), 404,
                 "Request for unknown model: 'add_sub' version 3 is not found")
    assert_error(httpx.get(url + "/v2/models/nope"), 404, "'nope' is not found")
    assert_error(httpx.get(url + "/v2/models/nope/config"), 404, "'nope' is not found")
    assert_error(httpx.get(url + "/v2/models/nope/ready"), 400, "Model version not ready")


def test_failed_model_and_model_errors(url: str) -> None:
    body = {"inputs": [tensor(), tensor("INPUT1")]}
    assert_error(post(url, "/v2/models/broken/infer", body), 404, "'broken' has no available versions")
    assert_error(post(url, "/v2/models/failing/infer", body), 500, "toy_error model 'failing' always fails")
    assert_error(post(url, "/v2/models/stream/infer", body), 501,
                 "HTTP end point doesn't support models with decoupled transaction policy")


def test_routing_errors(url: str) -> None:
    assert_error(httpx.get(url + "/v2/nothing/here"), 404, "Not Found")
    assert_error(httpx.get(url + "/v2/models/add_sub/infer"), 405, "Method Not Allowed")
    assert_error(post(url, "/v2/repository/other/index", {}), 404,
                 "model repository 'other' not found; the repositories are: 'models'")
