"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` with the model's own tokenizer, and the length check of huge
prompts: the ``tokenizer.json`` of the local Hugging Face tokenizer directory the model's config names (parameter
``tokenizer``), read with the ``tokenizers`` library off the event loop."""
from __future__ import annotations

import asyncio
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from triton_serve.frontend import ModelConfig

from . import requests as parse
from .errors import OpenAIError, bad_field
from .templates import load_template


def tokenizer_directory(config: ModelConfig) -> str:
    """The tokenizer directory ``config`` names (the ``tokenizer`` parameter), or ''."""
    return config.parameters["tokenizer"].string_value if "tokenizer" in config.parameters else ""


@lru_cache(maxsize=8)
def _load(directory: str) -> Any:
    from tokenizers import Tokenizer

    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise OpenAIError(f"the tokenizer directory '{directory}' has no tokenizer.json (a fast tokenizer)", 400,
                          param="model")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # the library raises its own kinds for a file it cannot read
        raise OpenAIError(f"cannot load the tokenizer '{path}': {error}", 500) from None


async def load_tokenizer(name: str, config: ModelConfig) -> Any:
    """The model's tokenizer (a ``tokenizers.Tokenizer``, loaded once, in a worker thread)."""
    directory = tokenizer_directory(config)
    if not directory:
        raise OpenAIError(f"model '{name}' names no tokenizer (its config parameter 'tokenizer')", 400,
                          param="model")
    return await asyncio.to_thread(_load, directory)


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


@lru_cache(maxsize=8)
def max_model_len(directory: str) -> int:
    """The model's context in tokens: ``max_position_embeddings`` of the config.json beside the tokenizer, else
    the tokenizer's ``model_max_length`` (0 when neither says)."""
    for value in (_json(Path(directory) / "config.json").get("max_position_embeddings"),
                  _json(Path(directory) / "tokenizer_config.json").get("model_max_length")):
        if isinstance(value, int) and 0 < value < 1 << 40:  # transformers writes a huge number for "unknown"
            return value
    return 0


# Prompts longer than this (characters) are measured against the model's context before anything runs.
PRECHECK_CHARS = 1 << 16
# A token stands for at most as many characters as its longest vocabulary entry; normalizers may fold a few
# characters into fewer, so the bound keeps this much room.
FOLDING_ROOM = 4


@lru_cache(maxsize=8)
def _longest_token(directory: str) -> int:
    tokenizer = _load(directory)
    return max((len(token) for token in tokenizer.get_vocab(with_added_tokens=True)), default=0)


async def check_context(name: str, config: ModelConfig, prompts: list[str], param: str) -> None:
    """Refuse (400) a prompt too long for the model's context on its length alone, without tokenizing it: a
    prompt of C characters holds at least C / (FOLDING_ROOM x the longest token) tokens. Only prompts over
    ``PRECHECK_CHARS`` are measured, and only for models whose tokenizer and context are known; the rest is the
    engine's to refuse."""
    longest = max(len(prompt) for prompt in prompts)
    directory = tokenizer_directory(config)
    if longest <= PRECHECK_CHARS or not directory:
        return
    try:
        token_chars = await asyncio.to_thread(_longest_token, directory)
    except OpenAIError:
        return  # no tokenizer to measure with: the engine decides
    context = max_model_len(directory)
    if not context or not token_chars:
        return
    at_least = longest // (FOLDING_ROOM * token_chars)
    if at_least > context:
        raise OpenAIError(f"This model's maximum context length is {context} tokens. However, the prompt "
                          f"({longest} characters) holds at least {at_least} tokens. Please reduce the length of "
                          "the prompt.", 400, param=param, code="context_length_exceeded")


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_field(name, f"'{name}' must be a boolean, got {value!r}")
    return value


async def answer(path: str, name: str, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
    """The answer to ``/tokenize`` or ``/detokenize`` (``path``) for the model ``name``."""
    tokenizer = await load_tokenizer(name, config)
    if path == "detokenize":
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise bad_field("tokens", "'tokens' must be a list of token ids")
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        wrong = next((token for token in tokens if not 0 <= token < size), None)
        if wrong is not None:
            raise bad_field("tokens", f"token id {wrong} is out of vocabulary (size {size})")
        return {"prompt": await asyncio.to_thread(tokenizer.decode, tokens, skip_special_tokens=False)}
    if "messages" in body:
        template = load_template(tokenizer_directory(config))
        prompt = template.render(parse.messages(body),
                                 add_generation_prompt=_flag(body, "add_generation_prompt", True))
        special = _flag(body, "add_special_tokens", False)
    else:
        given = body.get("prompt")
        if not isinstance(given, str):
            raise bad_field("prompt", "'prompt' must be a string (or send 'messages')")
        prompt = given
        special = _flag(body, "add_special_tokens", True)
    encoding = await asyncio.to_thread(tokenizer.encode, prompt, add_special_tokens=special)
    return {"count": len(encoding.ids), "max_model_len": max_model_len(tokenizer_directory(config)),
            "tokens": encoding.ids, "token_strs": encoding.tokens if _flag(body, "return_token_strs", False) else None}
