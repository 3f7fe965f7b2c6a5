"""Tool calling through the official openai client: ``auto`` with the llama3 parser (whole and streamed), a named
function (constrained decoding), tool turns in the conversation, and the refusals."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from triton_serve.testing import RunningServer

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TWO_CALLS = '<|python_tag|>' + WEATHER + '; {"name": "get_time", "parameters": {}}'


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)


def _say(text: str) -> list[Any]:
    return [{"role": "user", "content": f"«{text}»"}]


def test_auto_reads_the_models_calls(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="llm_vllm", messages=_say(WEATHER), tools=TOOLS, max_tokens=50)
    [choice] = answer.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("cmpl-")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    answer = client.chat.completions.create(model="llm_vllm", messages=_say(TWO_CALLS), tools=TOOLS, max_tokens=50)
    calls = answer.choices[0].message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert len({c.id for c in calls}) == 2


def test_auto_text_stays_content_and_the_template_sees_the_tools(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="llm_vllm", messages=[{"role": "user", "content": "hi"}],
                                            tools=TOOLS, max_tokens=50)
    [choice] = answer.choices
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert choice.message.content == "<|assistant|> hi <|user|> get_time get_weather <s><|tools|> "
    # a reply that looks like JSON but is no call is content too
    answer = client.chat.completions.create(model="llm_vllm", messages=_say('{"just": "json"}'), tools=TOOLS)
    assert answer.choices[0].message.content == '{"just": "json"}' and answer.choices[0].message.tool_calls is None
    # tool_choice "none": no tools in the prompt, nothing parsed
    answer = client.chat.completions.create(model="llm_vllm", messages=_say(WEATHER), tools=TOOLS,
                                            tool_choice="none", max_tokens=50)
    assert answer.choices[0].message.content == WEATHER and answer.choices[0].message.tool_calls is None


def _collect(stream: Any) -> tuple[str, dict[int, dict[str, str]], list[str | None]]:
    content, calls, reasons = "", {}, []
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += call.id or ""
                if call.function is not None:
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
            reasons.append(choice.finish_reason)
    return content, calls, reasons


def test_auto_streamed(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="llm_vllm", messages=_say(TWO_CALLS), tools=TOOLS,
                                                 max_tokens=50, stream=True))
    content, calls, reasons = _collect(chunks)
    assert content == "" and reasons[-1] == "tool_calls" and reasons[:-1] == [None] * (len(reasons) - 1)
    # the arguments come in pieces as the model writes them; each call's first delta has its id, type and name
    deltas = [call for chunk in chunks for choice in chunk.choices for call in choice.delta.tool_calls or []]
    assert len([call for call in deltas if call.index == 0 and call.function and call.function.arguments]) > 1
    for index in (0, 1):
        first = next(call for call in deltas if call.index == index)
        assert first.id and first.type == "function" and first.function and first.function.name
        assert all(call.type == "function" for call in deltas)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    stream = client.chat.completions.create(model="llm_vllm", messages=_say("plain words here"), tools=TOOLS,
                                            stream=True)
    content, calls, reasons = _collect(stream)
    assert (content, calls, reasons[-1]) == ("plain words here", {}, "stop")


def test_the_clients_stream_helper_rebuilds_the_calls(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(model="llm_vllm", messages=_say(TWO_CALLS), tools=TOOLS,
                                        max_tokens=50) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_completion()
    assert events[-1] == "tool_calls.function.arguments.done"  # the stream ended: the last call closed
    calls = final.choices[0].message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert final.choices[0].finish_reason == "tool_calls"


def test_a_streamed_call_past_the_parse_limit_is_cut_and_cancelled(server: RunningServer,
                                                                    client: openai.OpenAI) -> None:
    marker = Path(server.options.model_repositories[0]) / "llm_vllm" / "cancelled"
    marker.unlink(missing_ok=True)
    limit = server.options.openai.max_tool_call_parse_bytes
    words = " ".join(f"w{i}" for i in range(limit // 3))
    text = '{"name": "get_weather", "arguments": {"city": "' + words + '"}}'
    slowly: Any = [{"role": "user", "content": f"slow «{text}»"}]  # "slow": the model waits between tokens
    content, calls, reasons = _collect(client.chat.completions.create(
        model="llm_vllm", messages=slowly, tools=TOOLS, max_tokens=1000, stream=True))
    assert reasons[-1] == "length" and len(calls[0]["arguments"]) < limit
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline, "the model never saw the cancellation"
        time.sleep(0.05)
    # without tools the same reply is not read for calls, and is not cut
    _content, _calls, reasons = _collect(client.chat.completions.create(
        model="llm_vllm", messages=_say(text), max_tokens=1000, stream=True))
    assert reasons[-1] == "stop" and len(_content) > limit


def test_a_named_function_is_constrained_to_its_arguments(client: openai.OpenAI) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    answer = client.chat.completions.create(model="llm_vllm", messages=_say('{"city": "Oslo"}'), tools=TOOLS,
                                            tool_choice=choice)  # type: ignore[arg-type]
    [call] = answer.choices[0].message.tool_calls or []
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Oslo"}')
    stream = client.chat.completions.create(model="llm_vllm", messages=_say('{"city": "Oslo"}'), tools=TOOLS,
                                            tool_choice=choice, stream=True)  # type: ignore[arg-type]
    content, calls, reasons = _collect(stream)
    assert calls == {0: {"id": calls[0]["id"], "name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    assert reasons[-1] == "stop" and content == ""
    # the model is asked for the function's parameters as a JSON schema (vLLM's structured_outputs)
    answer = client.chat.completions.create(model="llm_vllm", messages=[{"role": "user", "content": "settings"}],
                                            tools=TOOLS, tool_choice=choice)  # type: ignore[arg-type]
    sent = json.loads((answer.choices[0].message.tool_calls or [])[0].function.arguments)
    assert json.loads(sent["structured_outputs"]) == {"json": TOOLS[0]["function"]["parameters"]}


def test_tool_turns_reach_the_template(client: openai.OpenAI) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call1", "content": "sunny"},
    ]
    answer = client.chat.completions.create(model="llm_vllm", messages=messages, tools=TOOLS, max_tokens=8)
    assert answer.choices[0].message.content == "<|assistant|> call1 <|for|> sunny <|tool|> {} get_weather <|call|> "


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": "auto"}, "tool_choice"),  # no tools
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
    ({"tools": TOOLS, "model": "llm_trtllm"}, "tools"),  # its template reads no tools
])
def test_bad_tool_requests_are_400(base_url: str, fields: dict[str, Any], param: str) -> None:
    body = {"model": "llm_vllm", "messages": [{"role": "user", "content": "hi"}], **fields}
    answer = httpx.post(f"{base_url}/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
