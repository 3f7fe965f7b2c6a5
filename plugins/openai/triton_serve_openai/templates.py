"""Chat templates: the Hugging Face tokenizer's own (``tokenizer_config.json`` or ``chat_template.jinja`` in a local
tokenizer directory), rendered with jinja2 as transformers renders it; never a download."""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import OpenAIError

# For a model without a tokenizer directory: each message on its own lines, then the assistant's turn.
DEFAULT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
                    "{% if add_generation_prompt %}assistant:{% endif %}")


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment


def _token(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict with its content."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return str(value) if value is not None else ""


class ChatTemplate:
    """One tokenizer's chat template with its special tokens."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        try:
            self.template = _environment().from_string(source)
        except jinja2.TemplateError as error:
            raise OpenAIError(f"the chat template does not compile: {error}", 500) from None
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.supports_tools = "tools" in source  # the template reads the request's tools

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
               add_generation_prompt: bool = True) -> str:
        """The prompt for ``messages`` (followed by the assistant's turn unless ``add_generation_prompt`` is
        False); a template's ``raise_exception`` (a role order it refuses, most often) is a 400."""
        try:
            return self.template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except jinja2.TemplateError as error:
            raise OpenAIError(f"the model's chat template refused the messages: {error}", 400,
                              param="messages") from None


@lru_cache(maxsize=32)
def load_template(directory: str) -> ChatTemplate:
    """The chat template of the tokenizer saved in ``directory`` (read once)."""
    if not directory:
        return ChatTemplate(DEFAULT_TEMPLATE)
    path = Path(directory)
    config_path = path / "tokenizer_config.json"
    try:
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    except (OSError, ValueError) as error:
        raise OpenAIError(f"cannot read the tokenizer configuration '{config_path}': {error}", 500) from None
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((item.get("template") for item in source if item.get("name") == "default"), None)
    jinja_path = path / "chat_template.jinja"
    if not source and jinja_path.is_file():
        source = jinja_path.read_text()
    if not source:
        if not path.is_dir():
            raise OpenAIError(f"tokenizer directory '{directory}' does not exist", 500)
        source = DEFAULT_TEMPLATE
    return ChatTemplate(source, _token(config.get("bos_token")), _token(config.get("eos_token")))
