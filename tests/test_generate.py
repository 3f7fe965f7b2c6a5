"""The generate extension: /generate and /generate_stream (SSE) over plain HTTP, with Triton's mapping and errors."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from triton_serve._engine.errors import ServerError
from triton_serve._engine.frontend.http.generate import SINGLE_RESPONSE
from triton_serve._engine.frontend.http.generate_json import generate_request

from .conftest import FRONTEND_MODES
from .test_grpc import FAILING, REPEAT
from .test_http_codec import ANY_JSON, json_places, with_value

TYPED = """
backend: "toy_identity"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }
input { name: "INPUT1" data_type: TYPE_STRING dims: [ 1 ] }
input { name: "INPUT2" data_type: TYPE_FP16 dims: [ 1 ] optional: true }
output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }
output { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 1 ] }
output { name: "OUTPUT2" data_type: TYPE_FP16 dims: [ 1 ] }
"""
BATCHED = """
backend: "toy_identity"
max_batch_size: 4
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }
"""


def events(text: str) -> list[dict]:  # type: ignore[type-arg]
    """The JSON objects of an SSE body, checking Triton's framing: ``data: {...}`` and a blank line."""
    assert text.endswith("\n\n")
    chunks = text[:-2].split("\n\n")
    assert all(chunk.startswith("data: ") for chunk in chunks)
    return [json.loads(chunk[len("data: "):]) for chunk in chunks]


@pytest.fixture
def server(add_model, toy_server):  # type: ignore[no-untyped-def]
    add_model("typed", TYPED)
    add_model("batched", BATCHED)
    add_model("repeat", REPEAT)
    add_model("failing", FAILING)
    return toy_server()


@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES, ids=lambda n: f"frontend_processes={n}")
def test_generate_maps_keys_to_inputs_and_outputs_back(server) -> None:  # type: ignore[no-untyped-def]
    base = f"http://{server.http_url}/v2/models"
    reply = httpx.post(f"{base}/typed/generate", json={"INPUT0": [1, 2, 3], "INPUT1": "héllo", "id": "g1",
                                                        "temperature": 0.5})
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    assert reply.json() == {"OUTPUT0": [1, 2, 3], "OUTPUT1": "héllo", "id": "g1", "model_name": "typed",
                            "model_version": "1"}
    assert list(reply.json()) == sorted(reply.json())  # Triton writes the keys in name order
    # one element is a scalar; the batch dimension is added for a batching model; versioned path
    reply = httpx.post(f"{base}/batched/versions/1/generate", json={"INPUT0": [1.5, -2]})
    assert reply.json() == {"OUTPUT0": [1.5, -2.0], "model_name": "batched", "model_version": "1"}
    reply = httpx.post(f"{base}/typed/generate", json={"INPUT0": 7, "parameters": {"INPUT1": "x", "top_k": 2}})
    assert reply.json()["OUTPUT0"] == 7 and reply.json()["OUTPUT1"] == "x"


@pytest.mark.parametrize("http_server", ["uvicorn", "hypercorn"])
@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES, ids=lambda n: f"frontend_processes={n}")
def test_generate_stream_sends_every_response_of_a_decoupled_model(server) -> None:  # type: ignore[no-untyped-def]
    url = f"http://{server.http_url}/v2/models/repeat/generate_stream"
    with httpx.stream("POST", url, json={"INPUT0": 3}) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
        body = "".join(reply.iter_text())
    assert events(body) == [{"OUTPUT0": i, "model_name": "repeat", "model_version": "1"} for i in range(3)]
    # a non-decoupled model streams its one response
    reply = httpx.post(f"http://{server.http_url}/v2/models/typed/generate_stream", json={"INPUT0": 1, "INPUT1": "a"})
    assert events(reply.text) == [{"OUTPUT0": 1, "OUTPUT1": "a", "model_name": "typed", "model_version": "1"}]


def test_generate_needs_exactly_one_response(server) -> None:  # type: ignore[no-untyped-def]
    base = f"http://{server.http_url}/v2/models/repeat"
    reply = httpx.post(f"{base}/generate", json={"INPUT0": 1})
    assert reply.status_code == 200 and reply.json() == {"OUTPUT0": 0, "model_name": "repeat", "model_version": "1"}
    for count in (0, 2):
        reply = httpx.post(f"{base}/generate", json={"INPUT0": count})
        assert reply.status_code == 500 and reply.json() == {"error": SINGLE_RESPONSE}
    assert httpx.post(f"{base}/generate_stream", json={"INPUT0": 0}).text == ""


def test_generate_errors_use_tritons_words(server) -> None:  # type: ignore[no-untyped-def]
    base = f"http://{server.http_url}/v2/models"

    def error(model: str, body: object, status: int, kind: str = "generate", **extra: object) -> str:
        reply = httpx.post(f"{base}/{model}/{kind}", content=json.dumps(body), **extra)  # type: ignore[arg-type]
        assert reply.status_code == status, reply.text
        return reply.json()["error"]

    assert "missing required input(s) ['INPUT1']" in error("typed", {"INPUT0": 1}, 400)
    assert error("typed", {"INPUT0": ["a"], "INPUT1": "x"}, 500) == \
        "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"
    assert error("typed", {"INPUT0": [True], "INPUT1": "x"}, 500) == \
        "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"
    assert error("typed", {"INPUT0": 1, "INPUT1": 5}, 500) == \
        "Unable to parse JSON bytes array: attempt to access JSON non-string as string"
    assert error("typed", {"INPUT0": 1, "INPUT1": ["a", "b"]}, 400) == \
        "The schema can not convert input 'INPUT1' to tensor with proper shape"
    assert error("typed", {"INPUT0": 1, "INPUT1": "x", "INPUT2": 1.0}, 400) == \
        "receiving FP16 data via JSON is not supported. Please use the binary data format for input INPUT2"
    assert error("typed", {"INPUT0": 1, "INPUT1": "x", "stop": [1]}, 400) == \
        "parameter 'stop' has invalid type. It should be either 'int', 'bool', or 'string'."
    assert error("typed", {"INPUT0": 1, "parameters": [1]}, 500) == \
        "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as object"
    assert error("typed", {"INPUT0": 1, "parameters": {"INPUT1": 3}}, 500) == \
        "Converting keyword: 'parameters': Unable to parse JSON bytes array: attempt to access JSON non-string as string"
    assert error("typed", {"INPUT0": 1, "id": 3}, 500) == \
        "Unable to parse 'id': attempt to access JSON non-string as string"
    assert error("typed", {"INPUT0": 1, "INPUT1": "\ud800"}, 400) == (  # JSON can spell a lone surrogate
        "Unable to parse JSON bytes array of input 'INPUT1': 'utf-8' codec can't encode character '\\ud800' in "
        "position 0: surrogates not allowed")
    assert error("batched", {"INPUT0": [1, 2, 3]}, 400) == \
        "The schema can not convert input 'INPUT0' to tensor with proper shape"
    assert error("missing", {}, 404) == "Request for unknown model: 'missing' is not found"
    assert error("typed", {}, 400, headers={"content-encoding": "gzip"}) == \
        "Unsupported content-encoding, only 'identity' is supported."
    assert error("typed", {}, 400, headers=[("content-encoding", "gzip"), ("content-encoding", "identity")]) == \
        "Unsupported content-encoding, only 'identity' is supported."  # the first of a repeated header counts
    reply = httpx.post(f"{base}/typed/generate", json={"INPUT0": 1, "INPUT1": "a"},
                       headers=[("content-encoding", "identity"), ("content-encoding", "gzip")])
    assert reply.status_code == 200, reply.text
    assert error("failing", {"INPUT0": [1]}, 500) == "toy_error model 'failing' always fails"
    reply = httpx.get(f"{base}/typed/generate")
    assert reply.status_code == 405 and reply.json() == {"error": "Method Not Allowed"}


@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES, ids=lambda n: f"frontend_processes={n}")
def test_repeated_keys_missing_inputs_and_empty_outputs(server) -> None:  # type: ignore[no-untyped-def]
    base = f"http://{server.http_url}/v2/models"

    def post(model: str, text: str) -> tuple[int, object]:
        reply = httpx.post(f"{base}/{model}/generate", content=text)
        return reply.status_code, reply.json()

    def error(message: str) -> tuple[int, dict[str, str]]:
        return 400, {"error": message}

    assert post("typed", '{"INPUT0": 1, "INPUT1": "x", "INPUT0": 2}') == error("input 'INPUT0' already exists in request")
    assert post("typed", '{"INPUT0": 1, "parameters": {"INPUT1": "x", "INPUT1": "y"}}') == \
        error("Converting keyword: 'parameters': input 'INPUT1' already exists in request")
    assert post("typed", '{"INPUT0": 1, "INPUT1": "x", "parameters": {"INPUT0": 2}}') == \
        error("Converting keyword: 'parameters': input 'INPUT0' already exists in request")
    assert post("typed", '{"INPUT0": 1, "INPUT1": "x", "top_k": 1, "top_k": 2}') == \
        error("parameter 'top_k' is given more than once in the generate request")
    # Triton counts optional inputs: typed takes 2 or 3
    assert post("typed", '{"INPUT0": 1}') == error(
        "expected number of inputs between 2 and 3 but got 1 inputs for model 'typed'. Got input(s) ['INPUT0'], "
        "but missing required input(s) ['INPUT1']. Please provide all required input(s).")
    assert post("batched", "{}") == error(
        "expected 1 inputs but got 0 inputs for model 'batched'. Got input(s) [], but missing required input(s) "
        "['INPUT0']. Please provide all required input(s).")
    # a zero-sized dimension: the model's empty output is an empty list; fixed dims cannot hold no elements
    assert post("typed", '{"INPUT0": [], "INPUT1": "x"}') == \
        (200, {"OUTPUT0": [], "OUTPUT1": "x", "model_name": "typed", "model_version": "1"})
    assert post("typed", '{"INPUT0": 1, "INPUT1": []}') == \
        error("The schema can not convert input 'INPUT1' to tensor with proper shape")


def test_a_model_error_in_a_stream_is_an_event(server) -> None:  # type: ignore[no-untyped-def]
    """Once the stream has started, a later failure arrives as ``data: {"error": ...}``."""
    reply = httpx.post(f"http://{server.http_url}/v2/models/typed/generate_stream",
                       json={"INPUT0": 1, "INPUT1": "x", "INPUT2": None})
    assert reply.status_code == 400  # a null is no FP16: refused before the stream starts
    url = f"http://{server.http_url}/v2/models/failing/generate_stream"
    with httpx.stream("POST", url, json={"INPUT0": [1]}) as streamed:
        assert streamed.status_code == 500
        assert events("".join(streamed.iter_text())) == [{"error": "toy_error model 'failing' always fails"}]


def test_keys_that_name_no_input_become_parameters() -> None:
    inputs = {"TEXT": {"name": "TEXT", "datatype": "BYTES", "shape": [1]},
              "IDS": {"name": "IDS", "datatype": "INT64", "shape": [-1, 2]}}
    request = generate_request({"TEXT": "hi", "IDS": [1, 2, 3, 4], "n": 2, "t": 0.5, "s": "x", "b": True,
                                "parameters": {"max_tokens": 8}, "id": "r"}, inputs, "m", None, 1 << 20)
    assert request.id == "r" and request.parameters == {"n": 2, "t": 0.5, "s": "x", "b": True, "max_tokens": 8,
                                                        "id": "r"}
    assert request.inputs["TEXT"].data.tolist() == [b"hi"]
    assert request.inputs["IDS"].shape == (2, 2) and request.inputs["IDS"].data.tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ServerError, match="Shape does not match true shape of 'data' field"):
        generate_request({"IDS": [[1, 2], [3, 4]]}, inputs, "m", None, 1 << 20)  # Triton counts the outer list
    with pytest.raises(ServerError, match="exceeds the maximum allowed input size of 8"):
        generate_request({"IDS": [1, 2, 3, 4]}, inputs, "m", None, 8)


# Triton's test_0_dimension_output: an LLM that stops at once returns np.array([]) (float64) for its text output.
EMPTY_TEXT = """
backend: "toy_identity"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_FP64 dims: [ 1, -1 ] }
output { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1, -1 ] }
"""


@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES, ids=lambda n: f"frontend_processes={n}")
def test_an_empty_output_of_another_datatype_answers_an_empty_list(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("empty_text", EMPTY_TEXT)
    server = toy_server()
    base = f"http://{server.http_url}/v2/models/empty_text"
    reply = httpx.post(f"{base}/generate", json={"INPUT0": []})
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    assert reply.json() == {"OUTPUT0": [], "model_name": "empty_text", "model_version": "1"}
    assert events(httpx.post(f"{base}/generate_stream", json={"INPUT0": []}).text) == [reply.json()]
    with httpclient.InferenceServerClient(server.http_url) as client:  # /infer: the config's datatype, no elements
        tensor = httpclient.InferInput("INPUT0", [1, 0], "FP64")
        tensor.set_data_from_numpy(np.zeros((1, 0), np.float64))
        result = client.infer("empty_text", [tensor])
        assert result.get_output("OUTPUT0")["datatype"] == "BYTES" and result.as_numpy("OUTPUT0").shape == (1, 0)
    reply = httpx.post(f"{base}/generate", json={"INPUT0": [1.5]})  # elements of another datatype still fail
    assert reply.status_code == 500
    assert reply.json()["error"] == ("model 'empty_text' returned output 'OUTPUT0' with datatype 'FP64', but its "
                                     "config declares 'BYTES'")


def test_any_json_value_anywhere_in_a_generate_body_is_a_request_or_a_server_error() -> None:
    inputs = {"TEXT": {"datatype": "BYTES", "shape": [1]}, "IDS": {"datatype": "INT64", "shape": [-1, 2]},
              "F": {"datatype": "FP32", "shape": [-1]}}
    body = {"TEXT": "hi", "IDS": [1, 2], "F": [0.5], "n": 2, "id": "r", "parameters": {"max_tokens": 8, "TEXT": "x"}}
    answered = refused = 0
    for path in json_places(body):
        for value in ANY_JSON:
            try:
                request = generate_request(with_value(body, path, value), inputs, "m", None, 1 << 20)
            except ServerError:
                refused += 1
                continue
            answered += 1
            assert all(type(v) in (str, bool, int, float) for v in request.parameters.values()), (path, value)
    assert answered and refused
