"""logprobs through the vLLM backend's contract (``return_logprobs`` in, ``logprobs`` JSON out), whole and
streamed, and the refusals; the test model gives token i logprob -i/10 and alternatives "alt<k>" logprob -k."""
from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)


def _top(index: int, token: str, top: int) -> list[tuple[str, float]]:
    return [(token, -index / 10)] + [(f"alt{k}", -float(k)) for k in range(1, top)]


def test_chat_logprobs(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "«one two three»"}]
    answer = client.chat.completions.create(model="llm_vllm", messages=messages, logprobs=True, top_logprobs=2)
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None
    assert [(t.token, t.logprob, bytes(t.bytes or [])) for t in content] == [
        ("one", 0.0, b"one"), (" two", -0.1, b" two"), (" three", -0.2, b" three")]
    assert [[(top.token, top.logprob) for top in t.top_logprobs] for t in content] == [
        _top(i, token, 2) for i, token in enumerate(["one", " two", " three"])]
    # logprobs alone: the selected token only (top_logprobs defaults to 1)
    answer = client.chat.completions.create(model="llm_vllm", messages=messages, logprobs=True)
    assert [len(t.top_logprobs) for t in answer.choices[0].logprobs.content or []] == [1, 1, 1]  # type: ignore[union-attr]
    assert client.chat.completions.create(model="llm_vllm", messages=messages).choices[0].logprobs is None
    stream = client.chat.completions.create(model="llm_vllm", messages=messages, logprobs=True, top_logprobs=3,
                                            stream=True)
    streamed = [t for chunk in stream for choice in chunk.choices if choice.logprobs is not None
                for t in choice.logprobs.content or []]
    assert [(t.token, [(top.token, top.logprob) for top in t.top_logprobs]) for t in streamed] == [
        (token, _top(i, token, 3)) for i, token in enumerate(["one", " two", " three"])]


def test_completion_logprobs(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="llm_vllm", prompt="«ab c de»", logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and answer.choices[0].text == "ab c de"
    assert logprobs.tokens == ["ab", " c", " de"] and logprobs.token_logprobs == [0.0, -0.1, -0.2]
    assert logprobs.text_offset == [0, 2, 4]
    assert logprobs.top_logprobs == [{"ab": 0.0, "alt1": -1.0}, {" c": -0.1, "alt1": -1.0}, {" de": -0.2, "alt1": -1.0}]
    stream = client.completions.create(model="llm_vllm", prompt="«ab c de»", logprobs=1, stream=True)
    pieces = [(choice.logprobs.tokens, choice.logprobs.text_offset) for chunk in stream for choice in chunk.choices
              if choice.logprobs is not None]
    assert pieces == [(["ab"], [0]), ([" c"], [2]), ([" de"], [4])]


@pytest.mark.parametrize("path, fields, param", [
    ("chat/completions", {"model": "llm_trtllm", "logprobs": True}, "logprobs"),  # not the vLLM contract
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs
    ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("completions", {"logprobs": 6}, "logprobs"),
    ("completions", {"model": "llm_trtllm", "logprobs": 1}, "logprobs"),
])
def test_logprobs_refusals(base_url: str, path: str, fields: dict[str, Any], param: str) -> None:
    body: dict[str, Any] = {"model": "llm_vllm", **fields}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if path.startswith("chat") else {"prompt": "hi"})
    answer = httpx.post(f"{base_url}/{path}", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
