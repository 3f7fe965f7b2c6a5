"""OpenAI request bodies, checked field by field: every field this front-end reads, with OpenAI's ranges."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .contract import Sampling
from .errors import bad_field

ROLES = ("system", "developer", "user", "assistant", "tool")
DEFAULT_MAX_TOKENS = 16  # Triton's --default-max-tokens
MAX_N = 16
MAX_STOP = 4
MAX_TOKENS = (1 << 31) - 1  # the INT32 max_tokens input of both contracts
# The most inference requests one request may start (prompts x n): one request must not occupy the server.
MAX_CHOICES = 256


@dataclass
class Generation:
    """What a chat or completion request asks for."""

    model: str
    sampling: Sampling
    n: int
    include_usage: bool


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_field(name, f"'{name}' must be a number, got {value!r}")
    if not low <= value <= high:
        raise bad_field(name, f"'{name}' must be between {low:g} and {high:g}, got {value}")
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_field(name, f"'{name}' must be an integer, got {value!r}")
    if not low <= value <= high:
        raise bad_field(name, f"'{name}' must be between {low} and {high}, got {value}")
    return value


def _boolean(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_field(name, f"'{name}' must be a boolean, got {value!r}")
    return value


def model_name(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_field("model", "'model' must be the name of a model, a non-empty string")
    return model


def generation(body: dict[str, Any], *, chat: bool) -> Generation:
    """The common fields of chat and completion requests."""
    max_tokens = _integer(body, "max_completion_tokens", 1, MAX_TOKENS) if chat else None
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1, MAX_TOKENS)
    stop = body.get("stop")
    if stop is None:
        stops = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(item, str) for item in stop) and len(stop) <= MAX_STOP:
        stops = list(stop)
    else:
        raise bad_field("stop", f"'stop' must be a string or a list of at most {MAX_STOP} strings")
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise bad_field("stream_options", "`stream_options` can only be used when `stream` is True")
        if not isinstance(options, dict):
            raise bad_field("stream_options", "'stream_options' must be an object")
    include_usage = _boolean(options or {}, "include_usage")
    logprobs = _logprobs(body, chat=chat)
    if body.get("logit_bias"):
        raise bad_field("logit_bias", "logit bias is not currently supported")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_field("user", "'user' must be a string")
    sampling = Sampling(
        max_tokens=max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS, stream=stream,
        temperature=_number(body, "temperature", 0, 2), top_p=_number(body, "top_p", 0, 1),
        presence_penalty=_number(body, "presence_penalty", -2, 2),
        frequency_penalty=_number(body, "frequency_penalty", -2, 2),
        seed=_integer(body, "seed", 0, (1 << 63) - 1), stop=stops,
        echo=False if chat else _boolean(body, "echo"), response_format=_response_format(body.get("response_format")),
        logprobs=logprobs, min_tokens=_integer(body, "min_tokens", 0, MAX_TOKENS),
        ignore_eos=_boolean(body, "ignore_eos") if "ignore_eos" in body else None,
        best_of=_integer(body, "best_of", 1, MAX_N))
    n = _integer(body, "n", 1, MAX_N) or 1
    if sampling.best_of is not None and sampling.best_of < n:
        raise bad_field("best_of", f"best_of must be greater than or equal to n, got n={n} and "
                        f"best_of={sampling.best_of}")
    if sampling.min_tokens is not None and sampling.min_tokens > sampling.max_tokens:
        raise bad_field("min_tokens", f"min_tokens must be less than or equal to max_tokens={sampling.max_tokens}, "
                        f"got {sampling.min_tokens}")
    return Generation(model_name(body), sampling, n, include_usage)


def _logprobs(body: dict[str, Any], *, chat: bool) -> int | None:
    """How many top logprobs per token the request asks for (None: no logprobs), as Triton's front-end reads
    OpenAI's fields: chat's ``logprobs`` (a boolean) with ``top_logprobs`` (0-20, default 1), completions'
    ``logprobs`` (0-5; 0 asks for none)."""
    if not chat:
        count = _integer(body, "logprobs", 0, 5)
        return count if count else None
    top = _integer(body, "top_logprobs", 0, 20)
    if not _boolean(body, "logprobs"):
        if top is not None:
            raise bad_field("top_logprobs", "`top_logprobs` can only be used when `logprobs` is True")
        return None
    return 1 if top is None else top


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_field("response_format", "'response_format' must be an object")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return value
    if kind == "json_schema":
        schema = value.get("json_schema")
        if not isinstance(schema, dict) or not isinstance(schema.get("schema", {}), dict):
            raise bad_field("response_format", "'response_format.json_schema' must be an object with a 'schema'")
        return value
    raise bad_field("response_format", "'response_format.type' must be 'text', 'json_object' or 'json_schema'")


def messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages, each with its content as one string (text parts joined)."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_field("messages", "'messages' must be a non-empty list of messages")
    conversation = []
    for index, message in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad_field(where, f"'{where}' must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise bad_field(f"{where}.role", f"'{where}.role' must be one of {', '.join(ROLES)}, got {role!r}")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad_field(f"{where}.content", f"'{where}.content' parts must be text parts "
                                    "({'type': 'text', 'text': ...}); this front-end serves text models")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            if role != "assistant":
                raise bad_field(f"{where}.content", f"'{where}.content' is missing")
            content = ""
        elif not isinstance(content, str):
            raise bad_field(f"{where}.content", f"'{where}.content' must be a string or a list of text parts")
        entry = {key: value for key, value in message.items() if key != "content"}
        entry["content"] = content
        conversation.append(entry)
    return conversation


def prompts(body: dict[str, Any], n: int) -> list[str]:
    """The completion prompts: one string or a list of them, none empty, at most ``MAX_CHOICES`` choices in all
    with ``n`` each."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        listed = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(item, str) for item in prompt):
        listed = list(prompt)
    else:
        raise bad_field("prompt", "'prompt' must be a string or a non-empty list of strings (token ids are not "
                        "supported)")
    if len(listed) * n > MAX_CHOICES:
        raise bad_field("prompt", f"{len(listed)} prompts with n={n} would start {len(listed) * n} generations; "
                        f"one request may start at most {MAX_CHOICES} (prompts x n)")
    for index, item in enumerate(listed):
        if not item:
            where = "prompt" if isinstance(prompt, str) else f"prompt[{index}]"
            raise bad_field(where, f"'{where}' is empty: the prompt cannot be empty")
    return listed

