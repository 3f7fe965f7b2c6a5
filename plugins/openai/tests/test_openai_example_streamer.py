"""The example repository's ``token_streamer`` through OpenAI's API, as the README shows it: the text it streams
back joins into exactly what it was given, spaces and line breaks included (its pieces carry the whitespace
before each word, as an LLM's streamed deltas do), for completions and for chat's templated prompt."""
from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from triton_serve.plugin import ServerOptions
from triton_serve.testing import EXAMPLE_REPOSITORY, RunningServer, free_port

PROMPT = "hello streaming world"
# The prompt the plain template (a model without a tokenizer directory) makes of one user message.
CHAT_PROMPT = "user: hi there\nassistant:"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    repo = tmp_path_factory.mktemp("examples")
    shutil.copytree(EXAMPLE_REPOSITORY / "token_streamer", repo / "token_streamer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    running = RunningServer(ServerOptions(
        model_repositories=[str(repo)], http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
        http_address="127.0.0.1", grpc_address="127.0.0.1", metrics_address="127.0.0.1",
        backend_config={"python": {"shm-region-prefix-name": f"tse_{os.getpid()}_{uuid.uuid4().hex[:6]}_"}}))
    try:
        yield openai.OpenAI(base_url=f"http://{running.http_url}/v1", api_key="unused", timeout=60, max_retries=0)
    finally:
        running.stop()


def test_a_completion_is_the_prompt_with_its_spaces(client: openai.OpenAI) -> None:
    assert client.completions.create(model="token_streamer", prompt=PROMPT).choices[0].text == PROMPT
    chunks = list(client.completions.create(model="token_streamer", prompt=PROMPT, stream=True))
    assert [chunk.choices[0].text for chunk in chunks] == ["hello", " streaming", " world", ""]
    assert chunks[-1].choices[0].finish_reason == "stop"  # the stream ended


def test_chat_echoes_the_templated_prompt_with_its_spaces(client: openai.OpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi there"}]
    answer = client.chat.completions.create(model="token_streamer", messages=messages)
    assert answer.choices[0].message.content == CHAT_PROMPT
    chunks = list(client.chat.completions.create(model="token_streamer", messages=messages, stream=True))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == CHAT_PROMPT
    assert chunks[-1].choices[0].finish_reason == "stop"
