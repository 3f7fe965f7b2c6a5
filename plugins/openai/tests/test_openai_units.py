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


def test_the_llama3_parser_and_what_a_stream_holds_back() -> None:
    from triton_serve_openai.tools import might_be_calls, parse_calls

    assert parse_calls("llama3", '{"name": "f", "parameters": {"x": "y"}}')[1][0]["function"] == {
        "name": "f", "arguments": '{"x": "y"}'}
    for text in ("hello", '{"name": "f"', '{"no": "name"}'):
        assert parse_calls("llama3", text) == (text, [])
    assert might_be_calls("llama3", "") and might_be_calls("llama3", "<|pyth") and might_be_calls("llama3", ' {"a')
    assert not might_be_calls("llama3", "Hello") and not might_be_calls("mistral", "Hello")
    assert might_be_calls("mistral", "[TOOL") and might_be_calls("mistral", "[{")
