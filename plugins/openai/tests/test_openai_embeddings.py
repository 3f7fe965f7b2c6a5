"""``POST /v1/embeddings`` through the official openai client, over a Python model that follows the vLLM
backend's embedding contract (its embedding of a text: [characters, words, 0.5, ...])."""
from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import openai
import pytest


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)


def test_embeddings(client: openai.OpenAI) -> None:
    answer = client.embeddings.create(model="embedder", input="hello big world", encoding_format="float")
    assert answer.object == "list" and answer.model == "embedder"
    [item] = answer.data
    assert (item.object, item.index, item.embedding) == ("embedding", 0, [15.0, 3.0, 0.5])
    assert (answer.usage.prompt_tokens, answer.usage.total_tokens) == (3, 3)
    answer = client.embeddings.create(model="embedder", input=["a b", "cde"], dimensions=2, encoding_format="float")
    assert [(item.index, item.embedding) for item in answer.data] == [(0, [3.0, 2.0]), (1, [3.0, 1.0])]
    assert answer.usage.prompt_tokens == 3


def test_base64_embeddings(base_url: str, client: openai.OpenAI) -> None:
    raw = httpx.post(f"{base_url}/embeddings", json={"model": "embedder", "input": "x y",
                                                     "encoding_format": "base64"}, timeout=30).json()
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype=np.float32)
    assert vector.tolist() == [3.0, 2.0, 0.5]
    # the openai client asks for base64 by default and decodes it
    assert client.embeddings.create(model="embedder", input="x y").data[0].embedding == [3.0, 2.0, 0.5]


@pytest.mark.parametrize("fields, status, param", [
    ({"model": "llm_vllm"}, 400, "model"),  # a generating model: no embedding_request input
    ({"model": "nope"}, 404, "model"),
    ({"input": ""}, 400, "input"),
    ({"input": [1, "a"]}, 400, "input"),
    ({"dimensions": 0}, 400, "dimensions"),
    ({"encoding_format": "hex"}, 400, "encoding_format"),
])
def test_embedding_refusals(base_url: str, fields: dict[str, Any], status: int, param: str) -> None:
    answer = httpx.post(f"{base_url}/embeddings", json={"model": "embedder", "input": "hi", **fields}, timeout=30)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param


def test_a_model_error_keeps_its_status(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError, match="cannot embed that"):
        client.embeddings.create(model="embedder", input=["ok", "fail"])
    assert client.embeddings.create(model="embedder", input="ok", encoding_format="float").data[0].embedding
