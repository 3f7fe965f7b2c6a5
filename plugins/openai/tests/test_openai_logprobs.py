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


def _chosen(index: int, token: str, top: int) -> tuple[str, float]:
    """The sampled token and its logprob: the model samples a token outside its top ones at every odd index."""
    return (token, -float(top + 1)) if index % 2 and top else (token, -index / 10)


def _top(index: int, token: str, top: int) -> list[tuple[str, float]]:
    """The ``top`` most likely tokens at ``index``, most likely first."""
    if index % 2 and top:
        return [(f"alt{k}", -k - 0.5) for k in range(top)]
    return ([(token, -index / 10)] + [(f"alt{k}", -float(k)) for k in range(1, top)])[:top]


WORDS = ["one", " two", " three"]


def test_chat_logprobs_choose_the_sampled_token_and_give_exactly_top_logprobs(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "«one two three»"}]
    answer = client.chat.completions.create(model="llm_vllm", messages=messages, logprobs=True, top_logprobs=2)
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None
    # the chosen tokens spell the text, even where sampling picked a token that was not the most likely
    assert "".join(t.token for t in content) == answer.choices[0].message.content == "one two three"
    assert [(t.token, t.logprob) for t in content] == [_chosen(i, w, 2) for i, w in enumerate(WORDS)]
    assert [bytes(t.bytes or []) for t in content] == [w.encode() for w in WORDS]
    assert [[(top.token, top.logprob) for top in t.top_logprobs] for t in content] == [
        _top(i, w, 2) for i, w in enumerate(WORDS)]
    # logprobs alone: one top logprob per token (Triton's default)
    answer = client.chat.completions.create(model="llm_vllm", messages=messages, logprobs=True)
    tokens = answer.choices[0].logprobs.content or []  # type: ignore[union-attr]
    assert [len(t.top_logprobs) for t in tokens] == [1, 1, 1]
    answer = client.chat.completions.create(model="llm_vllm", messages=messages, logprobs=True, top_logprobs=0)
    tokens = answer.choices[0].logprobs.content or []  # type: ignore[union-attr]
    assert [(t.token, t.top_logprobs) for t in tokens] == [(w, []) for w in WORDS]
    assert client.chat.completions.create(model="llm_vllm", messages=messages).choices[0].logprobs is None
    stream = client.chat.completions.create(model="llm_vllm", messages=messages, logprobs=True, top_logprobs=3,
                                            stream=True)
    chunks = list(stream)  # ends: the client stops at data: [DONE]
    assert chunks[-1].choices[0].finish_reason == "stop"
    streamed = [t for chunk in chunks for choice in chunk.choices if choice.logprobs is not None
                for t in choice.logprobs.content or []]
    assert [((t.token, t.logprob), [(top.token, top.logprob) for top in t.top_logprobs]) for t in streamed] == [
        (_chosen(i, w, 3), _top(i, w, 3)) for i, w in enumerate(WORDS)]


def test_completion_logprobs(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="llm_vllm", prompt="«ab c de»", logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and answer.choices[0].text == "ab c de"
    assert logprobs.tokens == ["ab", " c", " de"] and logprobs.token_logprobs == [0.0, -3.0, -0.2]
    assert logprobs.text_offset == [0, 2, 4]
    assert logprobs.top_logprobs == [{"ab": 0.0, "alt1": -1.0}, {"alt0": -0.5, "alt1": -1.5},
                                     {" de": -0.2, "alt1": -1.0}]
    stream = client.completions.create(model="llm_vllm", prompt="«ab c de»", logprobs=1, stream=True)
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "stop"
    pieces = [(choice.logprobs.tokens, choice.logprobs.text_offset, choice.logprobs.top_logprobs)
              for chunk in chunks for choice in chunk.choices if choice.logprobs is not None]
    assert pieces == [(["ab"], [0], [{"ab": 0.0}]), ([" c"], [2], [{"alt0": -0.5}]), ([" de"], [4], [{" de": -0.2}])]


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
