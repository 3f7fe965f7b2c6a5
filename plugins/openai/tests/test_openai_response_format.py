"""``response_format`` as constrained decoding: vLLM's ``structured_outputs`` sampling parameter (what Triton's
front-end sends for a named tool), TensorRT-LLM's ``guided_decoding_guide_type`` inputs, 400 where a model has
neither."""
from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

SETTINGS: Any = [{"role": "user", "content": "settings"}]  # the test model answers with its sampling parameters
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def test_the_format_reaches_a_vllm_model(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
    answer = client.chat.completions.create(model="llm_vllm", messages=SETTINGS, response_format={
        "type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}})
    sent = json.loads(answer.choices[0].message.content or "")
    assert json.loads(sent["structured_outputs"]) == {"json": SCHEMA}
    answer = client.chat.completions.create(model="llm_vllm", messages=SETTINGS,
                                            response_format={"type": "json_object"})
    assert json.loads(json.loads(answer.choices[0].message.content or "")["structured_outputs"]) == {
        "json_object": True}
    answer = client.chat.completions.create(model="llm_vllm", messages=SETTINGS, response_format={"type": "text"})
    assert "structured_outputs" not in json.loads(answer.choices[0].message.content or "")


@pytest.mark.parametrize("fields", [
    {"model": "llm_trtllm", "response_format": {"type": "json_object"}},  # no guided_decoding_guide_type input
    {"response_format": {"type": "yaml"}},
    {"response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
])
def test_formats_a_model_cannot_follow_are_400(base_url: str, fields: dict[str, Any]) -> None:
    body = {"model": "llm_vllm", "messages": [{"role": "user", "content": "hi"}], **fields}
    answer = httpx.post(f"{base_url}/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "response_format"
