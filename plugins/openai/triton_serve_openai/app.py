"""The ASGI app behind ``/v1/``: OpenAI's chat completions, completions and models over the data-plane seam.

Each choice of a request is one inference request to the model (``n`` choices and a list of prompts make several,
run at once); streamed answers are Server-Sent Events ending in ``data: [DONE]``. A client that disconnects cancels
every inference request it started."""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from triton_serve.frontend import DataPlaneAPI, InferenceRequest, ServerError, Status

from . import requests as parse
from .contract import Contract, Piece, Sampling
from .errors import OpenAIError
from .templates import load_template

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

OWNED_BY = "Triton Inference Server"
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


@dataclass
class Choice:
    """One choice being generated: its inference request and what it produced so far."""

    index: int
    prompt_index: int
    request: InferenceRequest
    text: str = ""
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None

    def add(self, piece: Piece, final: bool, max_tokens: int) -> None:
        self.text += piece.text
        if piece.input_tokens is not None:
            self.input_tokens = piece.input_tokens
        if piece.output_tokens is not None:
            self.output_tokens = (self.output_tokens or 0) + piece.output_tokens
        if piece.finish_reason is not None:
            self.finish_reason = piece.finish_reason
        if final and self.finish_reason is None:
            long = self.output_tokens is not None and self.output_tokens >= max_tokens
            self.finish_reason = "length" if long else "stop"


class OpenAIApp:
    """OpenAI's ``/v1`` API on the server's HTTP port (built once per front-end by the plugin hook)."""

    def __init__(self, api: DataPlaneAPI, max_input_size: int) -> None:
        self.api = api
        self.max_input_size = max_input_size
        self.created = int(time.time())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"].rstrip("/")
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._route(method, path, scope, receive, tracked_send)
        except (OpenAIError, ServerError) as error:
            if started:  # too late for a status: the client sees the stream cut short
                log.error("OpenAI %s %s failed after its answer began: %s", method, path, error)
                return
            failure = error if isinstance(error, OpenAIError) else OpenAIError.from_server(error)
            await _send(send, failure.status, _JSON, failure.encoded())
        except Exception as error:  # a bug here: answer it, as OpenAI shapes errors, and keep serving
            log.exception("OpenAI %s %s failed", method, path)
            if started:
                return
            failure = OpenAIError(f"internal error: {type(error).__name__}: {error}", 500)
            await _send(send, failure.status, _JSON, failure.encoded())

    async def _route(self, method: str, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        if path == "/v1/models" and method == "GET":
            await _send_json(send, 200, await self.models())
        elif path.startswith("/v1/models/") and method == "GET":
            await _send_json(send, 200, await self.model(path[len("/v1/models/"):]))
        elif path in ("/v1/chat/completions", "/v1/completions") and method == "POST":
            body = await self._body(scope, receive)
            await self._generate(body, path == "/v1/chat/completions", receive, send)
        elif path == "/v1/embeddings" and method == "POST":
            await self._body(scope, receive)
            raise OpenAIError("embeddings are not supported by this front-end yet", 501)
        elif path in ("/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings") \
                or path.startswith("/v1/models/"):
            raise OpenAIError(f"Method Not Allowed ({method} {path})", 405)
        else:
            raise OpenAIError(f"Invalid URL ({method} {path})", 404)

    # ---- models -----------------------------------------------------------------------------

    def _model_card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": OWNED_BY}

    async def models(self) -> dict[str, Any]:
        """Every ready model."""
        index = await self.api.repository_index(True)  # positional: a front-end process forwards them
        names = sorted({entry["name"] for entry in index})
        return {"object": "list", "data": [self._model_card(name) for name in names]}

    async def model(self, name: str) -> dict[str, Any]:
        if not await self.api.model_ready(name):
            raise _unknown_model(name)
        return self._model_card(name)

    async def _contract(self, name: str) -> Contract:
        try:
            config = await self.api.model_config(name)
        except ServerError as error:
            if error.status in (Status.NOT_FOUND, Status.UNAVAILABLE):
                raise _unknown_model(name) from None
            raise
        return Contract(name, config)

    # ---- generation -------------------------------------------------------------------------

    async def _body(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_input_size:
                raise self._too_large(int(value))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise OpenAIError("the client disconnected before sending the whole body", 400)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_input_size:
                raise self._too_large(size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        try:
            body = json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError) as error:
            raise OpenAIError(f"the request body is not valid JSON: {error}", 400, code="invalid_json") from None
        if not isinstance(body, dict):
            raise OpenAIError("the request body must be a JSON object", 400, code="invalid_json")
        return body

    def _too_large(self, size: int) -> OpenAIError:
        return OpenAIError(f"Request size of {size} bytes exceeds the maximum allowed input size of "
                           f"{self.max_input_size} bytes. Use --http-max-input-size to increase the limit.",
                           413, code="content_too_large")

    async def _generate(self, body: dict[str, Any], chat: bool, receive: Receive, send: Send) -> None:
        generation = parse.generation(body, chat=chat)
        if chat:
            parse.raise_for_tools(body)
            conversation = parse.messages(body)
        else:
            prompts = parse.prompts(body)
        contract = await self._contract(generation.model)
        if chat:
            tokenizer = contract.config.parameters["tokenizer"].string_value \
                if "tokenizer" in contract.config.parameters else ""
            prompts = [load_template(tokenizer).render(conversation)]
        sampling = generation.sampling
        prefix = "chatcmpl" if chat else "cmpl"
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        choices = self._start(contract, prompts, sampling, generation.n, request_id)
        answer = _Answer(request_id, generation.model, chat, sampling, prompts,
                         echo=sampling.echo and not contract.echoes)
        work = asyncio.create_task(self._answer(answer, choices, generation.include_usage, send))
        gone = asyncio.Event()
        watch = asyncio.create_task(_watch_disconnect(receive, choices, work, gone))
        try:
            await work
        except asyncio.CancelledError:
            if not gone.is_set():
                raise  # the server is stopping, not the client
        finally:
            watch.cancel()
            for choice in choices:
                if not choice.request.finished:
                    choice.request.cancel()

    @staticmethod
    async def _answer(answer: _Answer, choices: list[Choice], include_usage: bool, send: Send) -> None:
        if not answer.sampling.stream:
            await _send_json(send, 200, await answer.whole(choices))
            return
        events = answer.stream(choices, include_usage)
        first = await anext(events)  # a model that fails before its first token gets an HTTP error status
        await _send_start(send, 200, _SSE)
        await send({"type": "http.response.body", "body": first, "more_body": True})
        async for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    def _start(self, contract: Contract, prompts: list[str], sampling: Sampling, n: int,
               request_id: str) -> list[Choice]:
        """Submit one inference request per choice; if one cannot start, cancel those that did."""
        choices: list[Choice] = []
        try:
            for prompt_index, prompt in enumerate(prompts):
                for copy in range(n):
                    index = len(choices)
                    choice_sampling = sampling
                    if sampling.seed is not None and copy:
                        choice_sampling = Sampling(**{**sampling.__dict__, "seed": sampling.seed + copy})
                    request = contract.request(prompt, choice_sampling, f"{request_id}-{index}")
                    self.api.submit(request)
                    choices.append(Choice(index, prompt_index, request))
        except BaseException:
            for choice in choices:
                choice.request.cancel()
            raise
        return choices


class _Answer:
    """Turns the choices' responses into OpenAI's answer: one JSON body, or a stream of SSE events."""

    def __init__(self, request_id: str, model: str, chat: bool, sampling: Sampling, prompts: list[str],
                 echo: bool) -> None:
        self.id = request_id
        self.model = model
        self.chat = chat
        self.created = int(time.time())
        self.sampling = sampling
        self.prompts = prompts
        self.echo = echo  # put the prompt in front of the text here (the model cannot)

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def _usage(self, choices: list[Choice]) -> dict[str, int] | None:
        if any(choice.input_tokens is None or choice.output_tokens is None for choice in choices):
            return None
        prompt_tokens = sum({choice.prompt_index: choice.input_tokens or 0 for choice in choices}.values())
        completion_tokens = sum(choice.output_tokens or 0 for choice in choices)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    async def whole(self, choices: list[Choice]) -> dict[str, Any]:
        async def collect(choice: Choice) -> None:
            async for piece, final in _pieces(choice):
                choice.add(piece, final, self.sampling.max_tokens)
        await asyncio.gather(*(collect(choice) for choice in choices))
        entries = []
        for choice in choices:
            if self.chat:
                entries.append({"index": choice.index, "message": {"role": "assistant", "content": choice.text},
                                "logprobs": None, "finish_reason": choice.finish_reason})
            else:
                text = self.prompts[choice.prompt_index] + choice.text if self.echo else choice.text
                entries.append({"index": choice.index, "text": text, "logprobs": None,
                                "finish_reason": choice.finish_reason})
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self._head(kind), "choices": entries, "usage": self._usage(choices)}

    def _chunk(self, choice: Choice, text: str, finish_reason: str | None, *, first: bool = False,
               include_usage: bool = False) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            entry: dict[str, Any] = {"index": choice.index, "delta": delta, "logprobs": None,
                                     "finish_reason": finish_reason}
            doc = {**self._head("chat.completion.chunk"), "choices": [entry]}
        else:
            entry = {"index": choice.index, "text": text, "logprobs": None, "finish_reason": finish_reason}
            doc = {**self._head("text_completion"), "choices": [entry]}
        if include_usage:
            doc["usage"] = None
        return _event(doc)

    async def stream(self, choices: list[Choice], include_usage: bool) -> AsyncIterator[bytes]:
        """Every chunk as its SSE event, then the usage chunk (``include_usage``) and ``[DONE]``; a model's error
        ends the stream with an error event."""
        queue: asyncio.Queue[tuple[Choice, Piece | None, bool, ServerError | None]] = asyncio.Queue()

        async def pump(choice: Choice) -> None:
            try:
                async for piece, final in _pieces(choice):
                    queue.put_nowait((choice, piece, final, None))
            except ServerError as error:
                queue.put_nowait((choice, None, True, error))

        pumps = [asyncio.create_task(pump(choice)) for choice in choices]
        try:
            item: tuple[Choice, Piece | None, bool, ServerError | None] | None = await queue.get()
            assert item is not None
            if item[3] is not None:
                raise item[3]  # nothing sent yet: the answer is an HTTP error
            if self.chat:
                for choice in choices:
                    yield self._chunk(choice, "", None, first=True, include_usage=include_usage)
            started: set[int] = set()
            open_choices = len(choices)
            while open_choices:
                choice, piece, final, error = item if item is not None else await queue.get()
                item = None
                if error is not None:
                    yield _event(OpenAIError.from_server(error).body())
                    yield b"data: [DONE]\n\n"
                    return
                assert piece is not None
                choice.add(piece, final, self.sampling.max_tokens)
                text = piece.text
                if self.echo and choice.index not in started:
                    text = self.prompts[choice.prompt_index] + text
                started.add(choice.index)
                if text or final:
                    yield self._chunk(choice, text, choice.finish_reason if final else None,
                                      include_usage=include_usage)
                if final:
                    open_choices -= 1
            if include_usage:
                yield _event({**self._head("chat.completion.chunk" if self.chat else "text_completion"),
                              "choices": [], "usage": self._usage(choices)})
            yield b"data: [DONE]\n\n"
        finally:
            for task in pumps:
                task.cancel()


async def _pieces(choice: Choice) -> AsyncIterator[tuple[Piece, bool]]:
    """The choice's responses as pieces, until its final one; an error response is raised."""
    async for response, final in choice.request.responses():
        if response is None:
            if final:
                yield Piece(""), True
            continue
        if response.error is not None:
            raise response.error
        yield Contract.piece(response), final


async def _watch_disconnect(receive: Receive, choices: list[Choice], work: asyncio.Task[None],
                            gone: asyncio.Event) -> None:
    """When the client goes away: cancel every choice's request, and stop answering."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            for choice in choices:
                choice.request.cancel()
            work.cancel()
            return


def _unknown_model(name: str) -> OpenAIError:
    return OpenAIError(f"Unknown model: {name}", 404, param="model", code="model_not_found")


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


async def _send_start(send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], payload: bytes) -> None:
    await _send_start(send, status, [*headers, (b"content-length", str(len(payload)).encode())])
    await send({"type": "http.response.body", "body": payload})


async def _send_json(send: Send, status: int, doc: dict[str, Any]) -> None:
    await _send(send, status, _JSON, json.dumps(doc).encode())
