"""vLLM's ``/tokenize`` and ``/detokenize`` with the model's own tokenizer (a word-level one: see conftest)."""
from __future__ import annotations

from typing import Any

import httpx
import pytest


@pytest.fixture
def root(base_url: str) -> str:
    return base_url.removesuffix("/v1")


def test_tokenize_a_prompt_and_back(root: str) -> None:
    answer = httpx.post(f"{root}/tokenize", json={"model": "llm_vllm", "prompt": "hello there zebra"}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"count": 4, "max_model_len": 300, "tokens": [1, 3, 4, 0], "token_strs": None}
    answer = httpx.post(f"{root}/tokenize", timeout=60, json={
        "model": "llm_vllm", "prompt": "hello there", "add_special_tokens": False, "return_token_strs": True})
    assert answer.json()["tokens"] == [3, 4] and answer.json()["token_strs"] == ["hello", "there"]
    answer = httpx.post(f"{root}/detokenize", json={"model": "llm_vllm", "tokens": [3, 5]}, timeout=60)
    assert answer.status_code == 200 and answer.json() == {"prompt": "hello world"}


def test_tokenize_messages_through_the_chat_template(root: str) -> None:
    messages = [{"role": "user", "content": "hello"}]
    answer = httpx.post(f"{root}/tokenize", json={"model": "llm_vllm", "messages": messages,
                                                  "return_token_strs": True}, timeout=60)
    # the template writes "<s><|user|> hello <|assistant|>" (the special <s> splits off); no second <s> is added
    assert answer.json()["token_strs"] == ["<s>", "<|user|>", "hello", "<|assistant|>"]
    answer = httpx.post(f"{root}/tokenize", json={"model": "llm_vllm", "messages": messages,
                                                  "add_generation_prompt": False}, timeout=60)
    assert answer.json()["tokens"] == [1, 9, 3]


@pytest.mark.parametrize("path, body, status, param", [
    ("detokenize", {"model": "llm_vllm", "tokens": [3, 99]}, 400, "tokens"),
    ("detokenize", {"model": "llm_vllm", "tokens": "hello"}, 400, "tokens"),
    ("tokenize", {"model": "llm_vllm", "prompt": 7}, 400, "prompt"),
    ("tokenize", {"model": "llm_trtllm", "prompt": "hello"}, 400, "model"),  # names no tokenizer
    ("tokenize", {"model": "nope", "prompt": "hello"}, 404, "model"),
])
def test_tokenize_refusals(root: str, path: str, body: dict[str, Any], status: int, param: str) -> None:
    answer = httpx.post(f"{root}/{path}", json=body, timeout=60)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param
