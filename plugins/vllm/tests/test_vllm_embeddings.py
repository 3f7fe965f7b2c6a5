"""Triton's vLLM embedding contract against a real vLLM pooling engine: conftest.py's ``embed`` model (the session's
tiny Llama on vLLM's pooling runner), loaded for this module only (a second engine) and unloaded after it. A request
sends ``embedding_request`` (JSON: ``input``, ``pooling_params``); the vector comes back as JSON in ``text_output``."""
from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer

MODEL = "embed"  # conftest.py's EMBED_MODEL
HIDDEN = 64  # the tiny Llama's hidden size: the length of its embeddings
LOAD_TIMEOUT_S = 900
WAIT_S = 120


@pytest.fixture(scope="module")
def embed_model(server: RunningServer) -> Iterator[str]:
    """The embedding model, loaded for this module's tests; unloaded (its engine process ended) after them."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=LOAD_TIMEOUT_S)
    client.load_model(MODEL)
    try:
        yield server.http_url
    finally:
        client.unload_model(MODEL)
        deadline = time.monotonic() + WAIT_S
        while _state(client) != "UNAVAILABLE" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _state(client) == "UNAVAILABLE"


def _state(client: httpclient.InferenceServerClient) -> str | None:
    return next((entry.get("state") for entry in client.get_model_repository_index() if entry["name"] == MODEL),
                None)


def _embed(http_url: str, embedding_request: dict[str, Any], **flags: bool) -> httpx.Response:
    return httpx.post(f"http://{http_url}/v2/models/{MODEL}/generate",
                      json={"embedding_request": json.dumps(embedding_request), **flags}, timeout=WAIT_S)


def _vector(http_url: str, embedding_request: dict[str, Any]) -> np.ndarray:
    answer = _embed(http_url, embedding_request)
    assert answer.status_code == 200, answer.text
    vector = np.array(json.loads(answer.json()["text_output"]), dtype=np.float64)
    assert vector.ndim == 1
    return vector


def _token_ids(text: str) -> list[int]:
    """The character tokenizer's ids (conftest.py's model: "<unk>", "<s>", "</s>", then ASCII from space)."""
    return [3 + ord(char) - 32 for char in text]


def test_an_embedding_request_gives_the_vector_as_json_in_text_output(embed_model: str) -> None:
    answer = _embed(embed_model, {"input": "hello world"}, return_num_input_tokens=True,
                    return_num_output_tokens=True)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    vector = np.array(json.loads(body["text_output"]))
    assert vector.shape == (HIDDEN,) and vector.dtype == np.float64  # JSON numbers
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-4)  # vLLM's embedding pooler normalizes
    assert body["num_input_tokens"] == len("hello world") and body["num_output_tokens"] == 0
    assert np.array_equal(_vector(embed_model, {"input": "hello world"}), vector)  # the same input: the same vector
    assert not np.allclose(_vector(embed_model, {"input": "hello there"}), vector, atol=1e-3)
    # token ids are an input too: those of the text give the text's vector
    assert np.allclose(_vector(embed_model, {"input": _token_ids("hello world")}), vector, atol=1e-5)


def test_dimensions_cut_a_matryoshka_embedding_and_vllm_refuses_too_many(embed_model: str) -> None:
    whole = _vector(embed_model, {"input": "hello world"})
    cut = _vector(embed_model, {"input": "hello world", "pooling_params": {"dimensions": [16]}})
    assert cut.shape == (16,)
    assert np.allclose(cut, whole[:16] / np.linalg.norm(whole[:16]), atol=1e-4)  # the first 16, normalized again
    answer = _embed(embed_model, {"input": "hello world", "pooling_params": {"dimensions": [HIDDEN + 1]}})
    assert answer.status_code == 400
    assert f"only supports dimensions in range [1, {HIDDEN}], got {HIDDEN + 1}" in answer.json()["error"]


def test_grpc_stream_embedding_request(embed_model: str, server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        request = grpcclient.InferInput("embedding_request", [1], "BYTES")
        request.set_data_from_numpy(np.array([json.dumps({"input": "hello world"}).encode()], dtype=np.object_))
        client.async_stream_infer(MODEL, [request])
        result = results.get(timeout=WAIT_S)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    assert not isinstance(result, InferenceServerException), result
    (output,) = result.get_response().outputs
    assert (output.name, output.datatype, list(output.shape)) == ("text_output", "BYTES", [1])
    assert np.allclose(json.loads(result.as_numpy("text_output")[0]), _vector(embed_model, {"input": "hello world"}),
                       atol=1e-6)


def test_openai_embeddings_use_the_contract(embed_model: str) -> None:
    client = openai.OpenAI(base_url=f"http://{embed_model}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
    answer = client.embeddings.create(model=MODEL, input=["hello world", "hello there"])
    assert [len(item.embedding) for item in answer.data] == [HIDDEN, HIDDEN]
    assert np.allclose(answer.data[0].embedding, _vector(embed_model, {"input": "hello world"}), atol=1e-6)
    assert answer.usage.prompt_tokens == len("hello world") + len("hello there")
    cut = client.embeddings.create(model=MODEL, input="hello world", dimensions=16)
    assert len(cut.data[0].embedding) == 16


@pytest.mark.parametrize(("body", "message"), [
    ({"text_input": "Hi"}, f"Model {MODEL} does not support 'generate' request"),
    # Triton's backend checks a LoRA name first
    ({"text_input": "Hi", "sampling_parameters": json.dumps({"lora_name": "alpha"})}, "LoRA feature is not enabled."),
    ({"embedding_request": json.dumps({"text": "hello"})}, "'embedding_request' must be a JSON object with an 'input'"),
])
def test_requests_the_embedding_model_cannot_serve_are_refused(embed_model: str, body: dict[str, Any],
                                                               message: str) -> None:
    answer = httpx.post(f"http://{embed_model}/v2/models/{MODEL}/generate", json=body, timeout=WAIT_S)
    assert answer.status_code == 400
    assert answer.json()["error"] == message
