"""The messages between the server and its vLLM engine process, and their frames on the socket between them.

A frame is a 4-byte little-endian length and a pickled list of messages: every message that is ready at one
moment travels in one frame (the requests of one batch; the outputs of one engine step with its metrics). Both
ends are this package, so pickle is safe here and is the cheapest binary form of these small tuples.

Server to engine: ``("start", Start)`` first, then ``Generate``, ``Embed``, ``("abort", key)``. Engine to server: ``("ready", EngineInfo)`` or
``("fatal", message)`` once at start, then ``("out", key, Outputs, final)``, ``("error", key, message, status)``,
``("aborted", key, finish_reason, unfinished)`` and ``("metrics", MetricUpdate)``.
"""
from __future__ import annotations

import asyncio
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class Start:
    """The first message: vLLM's engine arguments (model.json, paths resolved), whether to gather Triton's vLLM
    metrics, and the LoRA adapters by name (multi_lora.json)."""

    model_name: str
    engine_args: dict[str, Any]
    metrics: bool = False
    loras: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Flags:
    """What a request asks back beside ``text_output`` (Triton's ``return_*`` inputs), and how its text is sent."""

    stream: bool = False
    prepend_input: bool = False
    finish_reason: bool = False
    cumulative_logprob: bool = False
    logprobs: bool = False
    num_input_tokens: bool = False
    num_output_tokens: bool = False


@dataclass(frozen=True)
class Generate:
    """One text generation: ``parameters`` are vLLM's sampling parameters (a JSON text, or the request's
    parameters as a dict); ``images`` the base64 images of the ``image`` input."""

    key: int
    prompt: str
    parameters: str | dict[str, Any]
    flags: Flags
    images: tuple[str, ...] = ()


@dataclass(frozen=True)
class Embed:
    """One embedding: ``request`` is the ``embedding_request`` input's JSON text."""

    key: int
    request: str
    flags: Flags


@dataclass(frozen=True)
class EngineInfo:
    """What the engine process says once its engine runs."""

    vllm_version: str
    device: str
    max_model_len: int
    tasks: tuple[str, ...]
    token_buckets: tuple[float, ...]  # vLLM's 1-2-5 buckets up to max_model_len (the token-count histograms)


@dataclass
class Outputs:
    """One response's outputs, one element per sequence (``n``); None where the request did not ask for it."""

    text: list[str]
    finish_reason: list[str] | None = None
    cumulative_logprob: list[float] | None = None
    logprobs: list[str] | None = None
    num_output_tokens: list[int] | None = None
    num_input_tokens: int | None = None

    def then(self, later: Outputs) -> Outputs:
        """One response saying what this one and the ``later`` one of the same request say."""
        return Outputs([text + more for text, more in zip(self.text, later.text)],
                       None if later.finish_reason is None or self.finish_reason is None else
                       [reason or before for before, reason in zip(self.finish_reason, later.finish_reason)],
                       later.cumulative_logprob,
                       None if later.logprobs is None or self.logprobs is None else
                       [_joined(before, more) for before, more in zip(self.logprobs, later.logprobs)],
                       None if later.num_output_tokens is None or self.num_output_tokens is None else
                       [count + more for count, more in zip(self.num_output_tokens, later.num_output_tokens)],
                       self.num_input_tokens)


def _joined(before: str, more: str) -> str:
    """Two JSON lists of logprobs as one ("null" when none were asked for)."""
    if before in ("[]", "null"):
        return more
    if more in ("[]", "null"):
        return before
    return f"{before[:-1]}, {more[1:]}"


@dataclass
class MetricUpdate:
    """What vLLM's stat loggers recorded since the last update: counter increments, histogram observations and
    the gauges' latest values (None: not reported since)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    time_to_first_token: list[float] = field(default_factory=list)
    time_per_output_token: list[float] = field(default_factory=list)
    e2e_latency: list[float] = field(default_factory=list)
    request_prompt_tokens: list[int] = field(default_factory=list)
    request_generation_tokens: list[int] = field(default_factory=list)
    request_params_n: list[int] = field(default_factory=list)
    running: int | None = None
    waiting: int | None = None
    kv_cache_usage: float | None = None

    def __bool__(self) -> bool:
        return bool(self.prompt_tokens or self.generation_tokens or self.time_to_first_token
                    or self.time_per_output_token or self.e2e_latency or self.request_prompt_tokens
                    or self.request_generation_tokens or self.request_params_n or self.running is not None
                    or self.waiting is not None or self.kv_cache_usage is not None)


def encode(messages: list[Any]) -> bytes:
    """One frame holding ``messages``."""
    body = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


class FrameProtocol(asyncio.Protocol):
    """Reads frames from a stream socket and hands their messages to ``on_messages``; ``on_closed`` is
    called once when the other end goes away (with the error, if any)."""

    def __init__(self, on_messages: Callable[[list[Any]], None],
                 on_closed: Callable[[Exception | None], None]) -> None:
        self._on_messages = on_messages
        self._on_closed = on_closed
        self._buffer = bytearray()
        self.transport: Any = None  # an asyncio.Transport (uvloop's does not subclass it)

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        """Hand over the messages of every whole frame received, together (a reader that fell behind catches up
        in one go)."""
        buffer = self._buffer
        buffer += data
        start = 0
        messages: list[Any] = []
        while len(buffer) - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            end = start + 4 + length
            if len(buffer) < end:
                break
            messages += pickle.loads(buffer[start + 4:end])
            start = end
        if start:
            del buffer[:start]
        if messages:
            self._on_messages(messages)

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_closed(exc)

    def send(self, messages: list[Any]) -> None:
        """Write one frame (buffered by the transport: never blocks)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(encode(messages))
