"""Parts of the front-end that need no server: body limits, chat templates and the model contracts."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from triton_serve.plugin import ModelConfig
from triton_serve_openai.app import OpenAIApp
from triton_serve_openai.contract import TRTLLM, VLLM, Contract, Sampling
from triton_serve_openai.errors import OpenAIError
from triton_serve_openai.templates import load_template


def _call(app: OpenAIApp, path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    chunks = [body[:5], body[5:]]

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"])


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_over_the_limit_is_413(declared: bool) -> None:
    app = OpenAIApp(None, max_input_size=10)  # type: ignore[arg-type]  # refused before the seam is asked
    body = b'{"model": "m", "prompt": "far too long"}'
    headers = [(b"content-length", str(len(body)).encode())] if declared else []
    status, doc = _call(app, "/v1/completions", body, headers)
    assert status == 413
    assert doc["error"]["code"] == "content_too_large"
    assert doc["error"]["message"].startswith(f"Request size of {len(body)} bytes exceeds the "
                                              "maximum allowed input size of 10 bytes")


def test_templates_from_tokenizer_config_and_jinja_file(tmp_path: Path) -> None:
    named = tmp_path / "named"
    named.mkdir()
    (named / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "chat_template": [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"}]}))
    assert load_template(str(named)).render([{"role": "user", "content": "hi"}]) == "hi</s>"
    separate = tmp_path / "separate"
    separate.mkdir()
    (separate / "chat_template.jinja").write_text("{{ messages | tojson }}")
    assert json.loads(load_template(str(separate)).render([{"role": "user", "content": "é"}])) == [
        {"role": "user", "content": "é"}]
    with pytest.raises(OpenAIError, match="does not exist"):
        load_template(str(tmp_path / "missing"))


def _config(text: str) -> ModelConfig:
    from google.protobuf import text_format
    return text_format.Parse(text, ModelConfig())


def test_contracts_are_told_apart_by_inputs() -> None:
    vllm = Contract("v", _config('backend: "vllm" input { name: "text_input" data_type: TYPE_STRING dims: [1] }'))
    assert vllm.kind == VLLM
    python = Contract("p", _config('backend: "python" input [{ name: "text_input" data_type: TYPE_STRING dims: [1] },'
                                   '{ name: "sampling_parameters" data_type: TYPE_STRING dims: [1] }]'))
    assert python.kind == VLLM
    trt = Contract("t", _config('max_batch_size: 8 input [{ name: "text_input" data_type: TYPE_STRING dims: [1] },'
                                '{ name: "max_tokens" data_type: TYPE_INT32 dims: [1] },'
                                '{ name: "stop_words" data_type: TYPE_STRING dims: [-1] }]'))
    assert trt.kind == TRTLLM
    request = trt.request("hi", Sampling(max_tokens=5, stop=["a", "b"]), "id")
    assert request.inputs["text_input"].shape == (1, 1)
    assert request.inputs["max_tokens"].data.tolist() == [[5]]
    assert request.inputs["stop_words"].shape == (1, 2)
    with pytest.raises(OpenAIError, match="takes no 'text_input' input"):
        Contract("x", _config('input { name: "INPUT0" data_type: TYPE_FP32 dims: [1] }'))


# ---- tool-call parsers --------------------------------------------------------------------------

def test_the_mistral_parser() -> None:
    from triton_serve_openai.tools import parse_calls

    content, calls = parse_calls("mistral", 'let me look [TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, '
                                            '{"name": "g", "arguments": {}}]')
    assert content == "let me look "
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("f", {"a": 1}),
                                                                                               ("g", {})]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() and c["type"] == "function" for c in calls)
    assert parse_calls("mistral", '[{"name": "f", "arguments": {}}]')[1][0]["function"]["name"] == "f"
    for text in ("plain text", "[TOOL_CALLS] [{broken", "[1, 2]"):
        assert parse_calls("mistral", text) == (text, [])


def test_the_llama3_parser() -> None:
    from triton_serve_openai.tools import parse_calls

    assert parse_calls("llama3", '{"name": "f", "parameters": {"x": "y"}}')[1][0]["function"] == {
        "name": "f", "arguments": '{"x": "y"}'}
    for text in ("hello", '{"name": "f"', '{"no": "name"}'):
        assert parse_calls("llama3", text) == (text, [])


def _streamed(parser: str, text: str, size: int) -> tuple[str, list[tuple[str, str, Any]], int]:
    """``text`` fed to a CallStream ``size`` characters at a time: the content, each call's (id, name, arguments)
    and how many deltas carried a call."""
    from triton_serve_openai.streamed_calls import CallStream

    stream, deltas = CallStream(parser), []
    for start in range(0, len(text), size):
        deltas += stream.feed(text[start:start + size])
    deltas += stream.finish()
    content, calls, carrying = "", {}, 0
    for delta in deltas:
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            carrying += 1
            assert call["type"] == "function"
            if call["index"] not in calls:  # a call's first delta names it
                assert call["id"] and call["function"]["name"]
                calls[call["index"]] = [call["id"], call["function"]["name"], ""]
            else:
                assert "id" not in call and "name" not in call["function"]
            calls[call["index"]][2] += call["function"]["arguments"]
    return content, [(i, n, json.loads(a)) for i, n, a in calls.values()], carrying


@pytest.mark.parametrize("size", [1, 2, 5, 13, 10_000])  # several tokens in one delta, up to the whole reply
def test_streamed_calls_arrive_as_argument_deltas(size: int) -> None:
    weather = '{"name": "get_weather", "arguments": {"city": "Paris", "nested": [1, {"brace": "}"}]}}'
    content, calls, carrying = _streamed("llama3", '<|python_tag|>' + weather + '; {"name": "t", "parameters": {}}',
                                         size)
    assert content == "" and [(name, args) for _id, name, args in calls] == [
        ("get_weather", {"city": "Paris", "nested": [1, {"brace": "}"}]}), ("t", {})]
    assert calls[0][0].startswith("cmpl-") and calls[0][0] != calls[1][0]
    if size == 1:
        assert carrying > 20  # the arguments come as they are written, not whole at the end
    content, calls, _ = _streamed("mistral", 'let me look [TOOL_CALLS] [' + weather +
                                  ', {"name": "g", "arguments": "{\\"a\\": 1}"}]', size)
    assert content == "let me look " and [(name, args) for _id, name, args in calls] == [
        ("get_weather", {"city": "Paris", "nested": [1, {"brace": "}"}]}), ("g", {"a": 1})]
    assert all(len(call_id) == 9 and call_id.isalnum() for call_id, _name, _args in calls)
    for parser, text in (("llama3", '{"just": "json"}'), ("llama3", "Hello there"), ("mistral", "a [1] b [TOOL"),
                         ("mistral", "[1, 2]"), ("llama3", '{"name": "f"}')):
        assert _streamed(parser, text, size) == (text, [], 0)
