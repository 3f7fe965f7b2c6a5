"""Requests refused before anything runs, in OpenAI's error shape: out-of-range ``max_tokens``, empty prompts, too
many generations in one request, and vLLM's own sampling parameters on an engine without them."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from triton_serve_openai.requests import MAX_CHOICES


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)


def _refusal(base_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{base_url}/{path}", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    return dict(error)


@pytest.mark.parametrize("path, field", [("completions", "max_tokens"), ("chat/completions", "max_tokens"),
                                         ("chat/completions", "max_completion_tokens")])
def test_max_tokens_past_int32_is_400(base_url: str, model: str, path: str, field: str) -> None:
    body: dict[str, Any] = {"model": model, field: 2147483648}
    body.update({"prompt": "a b"} if path == "completions" else {"messages": [{"role": "user", "content": "a"}]})
    assert _refusal(base_url, path, body)["param"] == field
    body[field] = 2147483647  # the largest INT32 reaches the model
    assert httpx.post(f"{base_url}/{path}", json=body, timeout=30).status_code == 200


def test_an_empty_prompt_is_400_and_others_run_on(base_url: str, client: openai.OpenAI, model: str) -> None:
    assert _refusal(base_url, "completions", {"model": model, "prompt": ""})["param"] == "prompt"
    assert _refusal(base_url, "completions", {"model": model, "prompt": ["a b", ""]})["param"] == "prompt[1]"
    stream = client.completions.create(model=model, prompt="x y z", stream=True)
    _refusal(base_url, "completions", {"model": model, "prompt": ""})
    chunks = list(stream)
    assert "".join(chunk.choices[0].text for chunk in chunks) == "z y x " and chunks[-1].choices[0].finish_reason


def test_prompts_times_n_is_bounded(base_url: str, model: str) -> None:
    prompts = ["w"] * 10_000
    error = _refusal(base_url, "completions", {"model": model, "prompt": prompts, "n": 16})
    assert error["param"] == "prompt" and f"at most {MAX_CHOICES}" in error["message"]
    error = _refusal(base_url, "completions", {"model": model, "prompt": ["w"] * (MAX_CHOICES // 8 + 1), "n": 8})
    assert "prompts x n" in error["message"]


def test_vllm_sampling_parameters_reach_a_vllm_contract_engine(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="llm_vllm", prompt="settings", max_tokens=5, n=2, best_of=3,
                                       extra_body={"min_tokens": 2, "ignore_eos": True})
    for choice in answer.choices:
        seen = json.loads(choice.text)
        assert (seen["min_tokens"], seen["ignore_eos"], seen["best_of"]) == (2, True, 3)
    messages: Any = [{"role": "user", "content": "settings"}]
    chat = client.chat.completions.create(model="llm_vllm", messages=messages, extra_body={"ignore_eos": False})
    assert json.loads(chat.choices[0].message.content or "")["ignore_eos"] is False


@pytest.mark.parametrize("fields", [{"min_tokens": 1}, {"ignore_eos": True}, {"best_of": 1}])
def test_vllm_sampling_parameters_are_refused_by_name_elsewhere(base_url: str, fields: dict[str, Any]) -> None:
    [name] = fields
    for path, body in (("completions", {"prompt": "a"}), ("chat/completions",
                                                           {"messages": [{"role": "user", "content": "a"}]})):
        error = _refusal(base_url, path, {"model": "llm_trtllm", **body, **fields})
        assert error["param"] == name and f"'{name}'" in error["message"]


@pytest.mark.parametrize("fields, param", [({"best_of": 1, "n": 2}, "best_of"), ({"min_tokens": 9, "max_tokens": 3},
                                                                                  "min_tokens"),
                                           ({"ignore_eos": "yes"}, "ignore_eos"), ({"min_tokens": -1}, "min_tokens")])
def test_vllm_sampling_parameters_are_checked(base_url: str, fields: dict[str, Any], param: str) -> None:
    assert _refusal(base_url, "completions", {"model": "llm_vllm", "prompt": "a", **fields})["param"] == param


@pytest.mark.parametrize("path", ["completions", "chat/completions"])
def test_a_huge_prompt_is_refused_on_its_length_while_health_checks_answer(base_url: str, path: str) -> None:
    words = "hello " * 900_000  # 5.4 MB: far past the tokenizer's context of 300 tokens
    body: dict[str, Any] = {"model": "llm_vllm"}
    body.update({"prompt": words} if path == "completions" else {"messages": [{"role": "user", "content": words}]})
    root = base_url.removesuffix("/v1")
    with httpx.Client(timeout=60) as big, httpx.Client(timeout=30) as health:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(big.post, f"{base_url}/{path}", json=body)
            statuses = []
            while not answer.done():
                statuses.append(health.get(f"{root}/v2/health/ready").status_code)
            refused = answer.result()
    assert set(statuses) <= {200}
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == ("prompt" if path == "completions"
                                                                              else "messages")
    assert error["message"].startswith("This model's maximum context length is 300 tokens.")
