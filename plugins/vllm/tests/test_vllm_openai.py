"""The official ``openai`` client against a vllm-backend model, through the OpenAI front-end (unchanged)."""
from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from triton_serve.testing import RunningServer
from triton_serve_vllm.engine_client import EngineClient


MODEL = "llm"  # conftest.py's model
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
WAIT_S = 120


@pytest.fixture
def client(http_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{http_url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)


MESSAGES: Any = [{"role": "user", "content": "Say hello"}]


def test_chat_and_completions(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert chat.choices[0].finish_reason == "length"
    assert len(chat.choices[0].message.content or "") == 8  # a character tokenizer: one character per token
    assert chat.usage is not None and chat.usage.completion_tokens == 8
    # the chat template of the model's tokenizer made the prompt: <s><|user|>Say hello\n<|assistant|>
    assert chat.usage.prompt_tokens == 1 + len("<|user|>Say hello\n<|assistant|>")
    completion = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=5, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert len(completion.choices[0].text) == 5 and completion.choices[0].finish_reason == "length"


def test_streaming_chat_ends_and_spells_the_whole_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0,
                                           extra_body={"ignore_eos": True})
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)  # the client stops at data: [DONE]: the stream ended
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == \
        whole.choices[0].message.content


def test_logprobs_choose_the_sampled_token(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, logprobs=True,
                                            top_logprobs=2, seed=3, extra_body={"ignore_eos": True})
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 6
    # the chosen tokens spell the text (the random model samples special tokens too, which the text leaves out)
    assert "".join(token.token for token in content if token.token not in SPECIAL_TOKENS) == \
        answer.choices[0].message.content
    assert all(len(token.top_logprobs) == 2 for token in content)
    assert all(token.top_logprobs[0].logprob >= token.logprob for token in content)


def test_n_2(client: openai.OpenAI) -> None:
    answer = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, n=2, seed=5,
                                       extra_body={"ignore_eos": True})
    assert sorted(choice.index for choice in answer.choices) == [0, 1]
    assert all(len(choice.text) == 4 for choice in answer.choices)


def test_bad_sampling_parameters_are_a_400_with_vllms_message(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, top_p=0)
    assert "top_p must be in (0, 1], got 0" in str(caught.value)


def test_a_client_that_leaves_a_stream_aborts_its_vllm_request(http_url: str, server: RunningServer,
                                                                engine: EngineClient) -> None:
    aborted_before = engine.aborted
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 8000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"http://{http_url}/v1/completions", json=body, timeout=WAIT_S) as response:
        assert response.status_code == 200
        next(response.iter_lines())  # the first chunk arrived: generation runs; leave
    deadline = time.monotonic() + WAIT_S
    while engine.aborted == aborted_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.aborted == aborted_before + 1
    assert engine.unfinished_after_abort == 0
