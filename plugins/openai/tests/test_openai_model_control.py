"""Triton's ``POST /v1/models/{model}/load`` and ``/unload`` (explicit model control: the shared server loads
explicitly) through the official client's raw requests."""
from __future__ import annotations

import httpx
import openai
import pytest


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def _post(base_url: str, path: str) -> httpx.Response:
    return httpx.post(f"{base_url}/models/{path}", timeout=60)


def test_unload_and_load_a_model(base_url: str, client: openai.OpenAI) -> None:
    answer = _post(base_url, "embedder/unload")
    assert answer.status_code == 200 and answer.json() == {"status": "success", "model": "embedder"}
    assert "embedder" not in [model.id for model in client.models.list().data]
    answer = _post(base_url, "embedder/unload")
    assert answer.status_code == 400 and answer.json()["error"]["message"] == "Unknown model: embedder"
    answer = _post(base_url, "embedder/load")
    assert answer.status_code == 200, answer.text
    card = answer.json()
    assert (card["id"], card["object"], card["owned_by"]) == ("embedder", "model", "Triton Inference Server")
    assert client.embeddings.create(model="embedder", input="back again").data[0].embedding[:2] == [10.0, 2.0]
    answer = _post(base_url, "embedder/load")
    assert answer.status_code == 400 and answer.json()["error"]["message"] == "Model 'embedder' is already loaded"


def test_loading_a_model_that_is_not_there_fails_with_the_reason(base_url: str) -> None:
    answer = _post(base_url, "nope/load")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith("Failed to load model 'nope': ")
    assert httpx.get(f"{base_url}/models/nope/load", timeout=60).status_code == 405
