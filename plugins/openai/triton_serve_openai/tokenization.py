"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` with the model's own tokenizer: the local Hugging Face
tokenizer directory its config names (parameter ``tokenizer``), loaded with transformers off the event loop."""
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


def tokenizer_directory(name: str, config: ModelConfig) -> str:
    """The tokenizer directory ``config`` names (the ``tokenizer`` parameter), or ''."""
    return config.parameters["tokenizer"].string_value if "tokenizer" in config.parameters else ""


@lru_cache(maxsize=8)
def _load(directory: str) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise OpenAIError("tokenizing needs the transformers package (pip install transformers)", 501) from None
    try:
        return AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except Exception as error:  # transformers raises many kinds for a directory it cannot read
        raise OpenAIError(f"cannot load the tokenizer in '{directory}': {type(error).__name__}: {error}",
                          500) from None


async def load_tokenizer(name: str, config: ModelConfig) -> Any:
    """The model's tokenizer (loaded once, in a worker thread)."""
    directory = tokenizer_directory(name, config)
    if not directory:
        raise OpenAIError(f"model '{name}' names no tokenizer (its config parameter 'tokenizer')", 400,
                          param="model")
    return await asyncio.to_thread(_load, directory)


def max_model_len(directory: str, tokenizer: Any) -> int:
    """The model's context in tokens: its config.json's ``max_position_embeddings`` beside the tokenizer, else the
    tokenizer's ``model_max_length`` (0 when neither says)."""
    config = Path(directory) / "config.json"
    try:
        length = json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else None
    except (OSError, ValueError):
        length = None
    if isinstance(length, int):
        return length
    length = getattr(tokenizer, "model_max_length", 0)
    return int(length) if isinstance(length, int) and length < 1 << 40 else 0


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
        size = len(tokenizer)
        wrong = next((token for token in tokens if not 0 <= token < size), None)
        if wrong is not None:
            raise bad_field("tokens", f"token id {wrong} is out of vocabulary (size {size})")
        return {"prompt": await asyncio.to_thread(tokenizer.decode, tokens)}
    if "messages" in body:
        template = load_template(tokenizer_directory(name, config))
        prompt = template.render(parse.messages(body),
                                 add_generation_prompt=_flag(body, "add_generation_prompt", True))
        special = _flag(body, "add_special_tokens", False)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad_field("prompt", "'prompt' must be a string (or send 'messages')")
        special = _flag(body, "add_special_tokens", True)
    ids = await asyncio.to_thread(tokenizer.encode, prompt, add_special_tokens=special)
    answer = {"count": len(ids), "max_model_len": max_model_len(tokenizer_directory(name, config), tokenizer),
              "tokens": ids, "token_strs": None}
    if _flag(body, "return_token_strs", False):
        answer["token_strs"] = tokenizer.convert_ids_to_tokens(ids)
    return answer
