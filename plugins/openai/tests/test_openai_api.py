"""The official openai client (sync, async, streaming) against Python models of both Triton LLM contracts."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from triton_serve.testing import RunningServer

Prompt = Callable[[list[dict[str, str]], str], str]
Reply = Callable[..., str]

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there world"}]


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)


def test_models_are_listed_and_retrieved(client: openai.OpenAI) -> None:
    listed = client.models.list()
    assert sorted(model.id for model in listed.data) == ["embedder", "llm_trtllm", "llm_vllm"]
    assert all(model.object == "model" and model.owned_by == "Triton Inference Server" for model in listed.data)
    assert client.models.retrieve("llm_vllm").id == "llm_vllm"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("nope")
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_chat_completion(client: openai.OpenAI,
        model: str, expected_prompt: Prompt, reply_to: Reply) -> None:
    answer = client.chat.completions.create(model=model, messages=MESSAGES, user="tester")  # type: ignore[arg-type]
    prompt = expected_prompt(MESSAGES, model)
    assert answer.object == "chat.completion" and answer.model == model
    [choice] = answer.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == reply_to(prompt)
    assert choice.finish_reason == "stop"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(prompt.split()), len(prompt.split()))
    assert answer.usage.total_tokens == 2 * len(prompt.split())


def test_chat_content_parts_and_assistant_turns(client: openai.OpenAI,
        model: str, expected_prompt: Prompt, reply_to: Reply) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}]},
                {"role": "assistant", "content": "three"}, {"role": "user", "content": "four"}]
    answer = client.chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]
    flat = [{"role": m["role"], "content": "one two" if i == 0 else m["content"]} for i, m in enumerate(messages)]
    assert answer.choices[0].message.content == reply_to(expected_prompt(flat, model))


def test_chat_stream_with_usage(client: openai.OpenAI,
        model: str, expected_prompt: Prompt, reply_to: Reply) -> None:
    stream = client.chat.completions.create(model=model, messages=MESSAGES, stream=True,  # type: ignore[arg-type]
                                            stream_options={"include_usage": True})
    chunks = list(stream)  # ends: the client stops at data: [DONE]
    prompt = expected_prompt(MESSAGES, model)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == reply_to(prompt)
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert len([chunk for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]) == len(prompt.split())
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt.split()), len(prompt.split()))
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_max_tokens_ends_with_length(client: openai.OpenAI,
        model: str, expected_prompt: Prompt, reply_to: Reply) -> None:
    answer = client.chat.completions.create(model=model, messages=MESSAGES,  # type: ignore[arg-type]
                                            max_completion_tokens=2)
    assert answer.choices[0].message.content == reply_to(expected_prompt(MESSAGES, model), 2)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 2
    chunks = list(client.completions.create(model=model, prompt="a b c d", max_tokens=3, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == "d c b "
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_words(client: openai.OpenAI, model: str) -> None:
    answer = client.completions.create(model=model, prompt="a b c d e", stop=["c", "zz"])
    assert answer.choices[0].text == "e d "
    assert answer.choices[0].finish_reason == "stop"


def test_completions_of_several_prompts_and_choices(client: openai.OpenAI, model: str) -> None:
    answer = client.completions.create(model=model, prompt=["a b", "c d e"], n=2, seed=7)
    assert answer.object == "text_completion"
    assert [(choice.index, choice.text) for choice in answer.choices] == [
        (0, "b a "), (1, "b a "), (2, "e d c "), (3, "e d c ")]
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (5, 10)


def test_echo_puts_the_prompt_first(client: openai.OpenAI, model: str) -> None:
    assert client.completions.create(model=model, prompt="x y", echo=True).choices[0].text == "x yy x "
    chunks = list(client.completions.create(model=model, prompt="x y", echo=True, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == "x yy x "


def test_sampling_settings_reach_the_model(client: openai.OpenAI, model: str) -> None:
    answer = client.completions.create(model=model, prompt="settings", temperature=0.5, top_p=0.25, seed=3,
                                       max_tokens=5)
    seen = json.loads(answer.choices[0].text)
    assert {key: seen[key] for key in ("temperature", "top_p", "seed")} == {"temperature": 0.5, "top_p": 0.25,
                                                                            "seed": 3}
    if model == "llm_vllm":
        assert seen["max_tokens"] == 5


def test_async_client_streams_at_once(base_url: str,
        model: str, expected_prompt: Prompt, reply_to: Reply) -> None:
    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30) as client:
            async def one(prompt: str) -> str:
                stream = await client.completions.create(model=model, prompt=prompt, stream=True)
                return "".join([chunk.choices[0].text async for chunk in stream])
            chat = await client.chat.completions.create(model=model, messages=MESSAGES)  # type: ignore[arg-type]
            texts = await asyncio.gather(*(one(f"p{i} q{i}") for i in range(4)))
            return [chat.choices[0].message.content or "", *texts]
    results = asyncio.run(run())
    assert results == [reply_to(expected_prompt(MESSAGES, model))] + [f"q{i} p{i} " for i in range(4)]


# ---- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, param", [
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": []}, "messages"),
    ({"n": 0}, "n"), ({"n": 1000}, "n"),
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": 5}, "temperature"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content"),
])
def test_bad_fields_are_400_naming_the_field(base_url: str, fields: dict[str, object], param: str) -> None:
    body = {"model": "llm_vllm", "messages": [{"role": "user", "content": "hi"}], **fields}
    answer = httpx.post(f"{base_url}/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_unknown_model_malformed_json_and_unknown_path(base_url: str, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="Unknown model: nope"):
        client.chat.completions.create(model="nope", messages=MESSAGES)  # type: ignore[arg-type]
    answer = httpx.post(f"{base_url}/chat/completions", content=b"{not json", timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json"
    lone_surrogate = b'{"model": "llm_vllm", "messages": [{"role": "user", "content": "\\ud800"}]}'
    answer = httpx.post(f"{base_url}/chat/completions", content=lone_surrogate, timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json", answer.text
    assert "surrogates not allowed" in answer.json()["error"]["message"]
    answer = httpx.post(f"{base_url}/nothing", json={}, timeout=30)
    assert answer.status_code == 404 and set(answer.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(f"{base_url}/chat/completions", timeout=30).status_code == 405


def test_a_prompt_over_the_context_is_400_and_the_server_serves_on(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError, match="do not fit the model's context of 300 tokens"):
        client.completions.create(model=model, prompt="w " * 301)
    with pytest.raises(openai.BadRequestError, match="context"):  # streamed: refused before the first event
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "w " * 301}], stream=True)
    assert client.completions.create(model=model, prompt="still here").choices[0].text == "here still "


def test_a_template_refusal_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="must not start with the assistant"):
        client.chat.completions.create(model="llm_vllm", messages=[{"role": "assistant", "content": "hi"}])


def test_model_errors(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.InternalServerError, match="the model blew up"):
        client.completions.create(model=model, prompt="boom a b c")
    stream = client.completions.create(model=model, prompt="boom a b c", stream=True)
    texts = []
    with pytest.raises(openai.APIError, match="blew up mid-stream"):
        for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert texts == ["c "]
    assert client.completions.create(model=model, prompt="still serving").choices[0].text == "serving still "


def _await_cancellation(marker: Path) -> None:
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline, "the model never saw the cancellation"
        time.sleep(0.05)


def test_a_client_that_leaves_mid_stream_cancels_the_request(server: RunningServer, base_url: str) -> None:
    marker = Path(server.options.model_repositories[0]) / "llm_vllm" / "cancelled"
    marker.unlink(missing_ok=True)
    prompt = " ".join(["slow"] + [f"w{i}" for i in range(200)])
    with httpx.stream("POST", f"{base_url}/completions", timeout=30,
                      json={"model": "llm_vllm", "prompt": prompt, "stream": True, "max_tokens": 200}) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: "):
                break  # one token seen: leave
    _await_cancellation(marker)


@pytest.mark.parametrize("path", ["completions", "chat/completions"])
def test_a_client_that_leaves_before_the_answer_cancels_every_choice(server: RunningServer, base_url: str,
                                                                     path: str) -> None:
    marker = Path(server.options.model_repositories[0]) / "llm_vllm" / "cancelled"
    marker.unlink(missing_ok=True)
    prompt = " ".join(["slow"] + [f"w{i}" for i in range(200)])  # 200 tokens 50 ms apart: 10 s unless cancelled
    body: dict[str, object] = {"model": "llm_vllm", "max_tokens": 200, "n": 2}
    body.update({"prompt": prompt} if path == "completions" else {"messages": [{"role": "user", "content": prompt}]})
    with pytest.raises(httpx.ReadTimeout):  # the client gives up (and closes the connection) before the answer
        httpx.post(f"{base_url}/{path}", json=body, timeout=httpx.Timeout(30, read=0.5))
    _await_cancellation(marker)


def test_n_choices_streamed_with_usage(client: openai.OpenAI, model: str) -> None:
    chunks = list(client.completions.create(model=model, prompt=["a b", "c d e"], n=2, stream=True,
                                            stream_options={"include_usage": True}))
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in chunks[:-1]:
        [choice] = chunk.choices
        texts[choice.index] = texts.get(choice.index, "") + choice.text
        if choice.finish_reason:
            finishes[choice.index] = choice.finish_reason
    assert texts == {0: "b a ", 1: "b a ", 2: "e d c ", 3: "e d c "} and finishes == dict.fromkeys(range(4), "stop")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # the usage chunk ends the stream
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (5, 10)
