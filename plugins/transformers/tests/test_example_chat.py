"""The example repository's chat model: made on first start (no download), served through the OpenAI API, and
listed unavailable with the install hint where triton-serve-transformers is not installed."""
from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import tritonclient.http as http

from triton_serve.testing import EXAMPLE_REPOSITORY, RunningServer
from triton_serve_transformers.tiny import ensure_tiny_llama


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The example chat model as it is committed: its config and an empty version directory."""
    (tmp_path / "models" / "chat" / "1").mkdir(parents=True)
    shutil.copy(EXAMPLE_REPOSITORY / "chat" / "config.pbtxt", tmp_path / "models" / "chat")
    return tmp_path / "models"


def test_the_example_chat_model_is_made_on_first_start_and_chats(
        tserve: Callable[..., RunningServer], repo: Path) -> None:
    server = tserve(repo)
    assert (repo / "chat" / "1" / "config.json").is_file() and (repo / "chat" / "1" / "tokenizer.json").is_file()
    client = openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)
    messages: Any = [{"role": "user", "content": "Hello!"}]
    answer = client.chat.completions.create(model="chat", messages=messages, max_tokens=8, temperature=0)
    assert answer.usage is not None and answer.usage.prompt_tokens > len("Hello!")  # the chat template's tokens
    assert answer.choices[0].finish_reason in ("stop", "length")
    stream = client.chat.completions.create(model="chat", messages=messages, max_tokens=8, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == \
        answer.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == answer.choices[0].finish_reason
    assert [model.id for model in client.models.list()] == ["chat"]


def test_a_version_directory_that_cannot_be_written_uses_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "not-a-directory").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    made = ensure_tiny_llama(tmp_path / "not-a-directory" / "1", "chat")
    assert made == tmp_path / "cache" / "triton-serve" / "tiny-models" / "chat"
    assert (made / "config.json").is_file() and not list(made.glob(".making-*"))
    assert ensure_tiny_llama(tmp_path / "not-a-directory" / "1", "chat") == made  # made once


def test_without_the_plugin_the_chat_model_names_its_package(
        tserve: Callable[..., RunningServer], repo: Path) -> None:
    server = tserve(repo, blocked_plugins=["transformers"])  # as if triton-serve-transformers were not installed
    index = {entry["name"]: entry for entry in http.InferenceServerClient(server.http_url).get_model_repository_index()}
    assert index["chat"]["state"] == "UNAVAILABLE"
    assert "pip install triton-serve-transformers" in index["chat"]["reason"]
    assert not (repo / "chat" / "1" / "config.json").exists()  # nothing made for a backend that is not there
