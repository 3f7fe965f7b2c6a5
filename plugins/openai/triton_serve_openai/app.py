"""The ASGI app behind ``/v1/``: OpenAI's chat completions, completions, embeddings and models over the data-plane
seam.

Each choice of a request is one inference request to the model (``n`` choices and a list of prompts make several,
run at once); streamed answers are Server-Sent Events ending in ``data: [DONE]``. A client that disconnects cancels
every inference request it started."""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from triton_serve.frontend import DataPlaneAPI, InferenceRequest, ModelConfig, OpenAIOptions, ServerError, Status

from . import requests as parse
from . import tokenization
from .contract import VLLM, Contract, Piece, Sampling
from .embeddings import create_embeddings
from .errors import OpenAIError
from .templates import load_template
from .streamed_calls import CallStream
from .tools import ToolRequest, parse_calls, tool_request

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
    calls: CallStream | None = None  # auto tool choice, streamed: reads the calls as the reply grows
    logprobs: list[dict[str, dict[str, Any]]] = field(default_factory=list)  # the vLLM contract's, per token
    streamed_chars: int = 0  # text sent so far (a streamed completion's logprob offsets count from it)
    call_id: str = ""  # a named tool's call, once its first chunk went out

    def add(self, piece: Piece, final: bool, max_tokens: int) -> None:
        self.text += piece.text
        if piece.logprobs:
            self.logprobs.extend(piece.logprobs)
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

    def __init__(self, api: DataPlaneAPI, max_input_size: int, options: OpenAIOptions | None = None) -> None:
        self.api = api
        self.max_input_size = max_input_size
        self.options = options if options is not None else OpenAIOptions()
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
        elif path.startswith("/v1/models/") and path.endswith(("/load", "/unload")) and method == "POST":
            await self._body(scope, receive, json_body=False)
            name, _, action = path[len("/v1/models/"):].rpartition("/")
            await _send_json(send, 200, await (self.load(name) if action == "load" else self.unload(name)))
        elif path.startswith("/v1/models/") and not path.endswith(("/load", "/unload")) and method == "GET":
            await _send_json(send, 200, await self.model(path[len("/v1/models/"):]))
        elif path in ("/tokenize", "/detokenize") and method == "POST":
            body = await self._body(scope, receive)
            name = parse.model_name(body)
            await _send_json(send, 200, await tokenization.answer(path[1:], name, await self._config(name), body))
        elif path in ("/v1/chat/completions", "/v1/completions") and method == "POST":
            body = await self._body(scope, receive)
            await self._generate(body, path == "/v1/chat/completions", receive, send)
        elif path == "/v1/embeddings" and method == "POST":
            body = await self._body(scope, receive)
            name = parse.model_name(body)
            await _send_json(send, 200, await create_embeddings(self.api, name, await self._config(name), body))
        elif path in ("/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize",
                      "/detokenize") \
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

    async def load(self, name: str) -> dict[str, Any]:
        """``POST /v1/models/{model}/load``: load a model (explicit model control only), as Triton's front-end."""
        self._check_model_control()
        if await self.api.model_ready(name):
            raise OpenAIError(f"Model '{name}' is already loaded", 400)
        try:
            await self.api.load_model(name, {})
        except ServerError as error:
            raise _model_control_error(f"Failed to load model '{name}': {error.message}", error) from None
        return self._model_card(name)

    async def unload(self, name: str) -> dict[str, Any]:
        """``POST /v1/models/{model}/unload``: unload a loaded model (explicit model control only)."""
        self._check_model_control()
        if not await self.api.model_ready(name):
            raise OpenAIError(f"Unknown model: {name}", 400)
        try:
            await self.api.unload_model(name)
        except ServerError as error:
            raise _model_control_error(f"Failed to unload model '{name}': {error.message}", error) from None
        return {"status": "success", "model": name}

    def _check_model_control(self) -> None:
        if not self.options.explicit_model_control:
            raise OpenAIError("Model load/unload requires --model-control-mode=explicit", 400)

    async def _config(self, name: str) -> ModelConfig:
        try:
            return await self.api.model_config(name)
        except ServerError as error:
            if error.status in (Status.NOT_FOUND, Status.UNAVAILABLE):
                raise _unknown_model(name) from None
            raise

    async def _contract(self, name: str) -> Contract:
        return Contract(name, await self._config(name))

    # ---- generation -------------------------------------------------------------------------

    async def _body(self, scope: Scope, receive: Receive, *, json_body: bool = True) -> dict[str, Any]:
        """The request's JSON object (``json_body`` False: read to its end, and ignored)."""
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
        if not json_body:
            return {}
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
            if b"\\u" in raw or b"\xed" in raw:  # how a lone surrogate, which no tokenizer takes, can be spelt
                json.dumps(body, ensure_ascii=False).encode()
        except (ValueError, UnicodeDecodeError) as error:  # UnicodeEncodeError is a ValueError
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
        tools = ToolRequest([], "none")
        if chat:
            tools = tool_request(body, self.options.tool_call_parser)
            conversation = parse.messages(body)
        else:
            prompts = parse.prompts(body, generation.n)
        contract = await self._contract(generation.model)
        sampling = generation.sampling
        if chat:
            tokenizer = contract.config.parameters["tokenizer"].string_value \
                if "tokenizer" in contract.config.parameters else ""
            template = load_template(tokenizer)
            if tools.template_tools and not template.supports_tools:
                raise OpenAIError(f"model '{generation.model}' cannot call tools: its chat template reads no "
                                  "'tools'", 400, param="tools")
            prompts = [template.render(conversation, tools.template_tools)]
            if tools.mode == "named":  # the model writes the named function's arguments, constrained to its schema
                if contract.kind != VLLM and "guided_decoding_guide_type" not in contract.inputs:
                    raise OpenAIError(f"model '{generation.model}' cannot call a named function: it has no "
                                      "constrained decoding ('guided_decoding_guide_type' input)", 400,
                                      param="tool_choice")
                sampling = Sampling(**{**sampling.__dict__, "response_format": tools.guided_schema()})
        await tokenization.check_context(generation.model, contract.config, prompts, "messages" if chat else "prompt")
        prefix = "chatcmpl" if chat else "cmpl"
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        choices = self._start(contract, prompts, sampling, generation.n, request_id)
        answer = _Answer(request_id, generation.model, chat, sampling, prompts,
                         echo=sampling.echo and not contract.echoes, tools=tools,
                         max_tool_call_parse_bytes=self.options.max_tool_call_parse_bytes)
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
                 echo: bool, tools: ToolRequest, max_tool_call_parse_bytes: int) -> None:
        self.id = request_id
        self.max_tool_call_parse_bytes = max_tool_call_parse_bytes
        self.model = model
        self.chat = chat
        self.created = int(time.time())
        self.sampling = sampling
        self.prompts = prompts
        self.echo = echo  # put the prompt in front of the text here (the model cannot)
        self.tools = tools

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
                message = self._message(choice)
                entries.append({"index": choice.index, "message": message,
                                "logprobs": self._logprobs(choice.logprobs, 0),
                                "finish_reason": "tool_calls" if message.get("tool_calls") and
                                self.tools.mode == "auto" else choice.finish_reason})
            else:
                text = self.prompts[choice.prompt_index] + choice.text if self.echo else choice.text
                entries.append({"index": choice.index, "text": text,
                                "logprobs": self._logprobs(choice.logprobs, len(text) - len(choice.text)),
                                "finish_reason": choice.finish_reason})
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self._head(kind), "choices": entries, "usage": self._usage(choices)}

    def _message(self, choice: Choice) -> dict[str, Any]:
        """A whole chat choice's message: its text, or the tool calls in it."""
        if self.tools.mode == "named":
            assert self.tools.function is not None
            return {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"cmpl-{uuid.uuid4()}", "type": "function",
                "function": {"name": self.tools.function["name"], "arguments": choice.text}}]}
        if self.tools.mode == "auto":
            assert self.tools.parser is not None
            content, calls = parse_calls(self.tools.parser, choice.text)
            if calls:
                return {"role": "assistant", "content": content or None, "tool_calls": calls}
        return {"role": "assistant", "content": choice.text}

    def _tool_deltas(self, choice: Choice, text: str, final: bool) -> list[tuple[dict[str, Any], str | None]]:
        """A streamed chat choice's next deltas (with their finish reasons) where tools are in play: a named
        tool's arguments as they come; with ``auto``, content once it cannot be a call, and each call's arguments
        as the model writes them."""
        reason = choice.finish_reason if final else None
        if self.tools.mode == "named":
            assert self.tools.function is not None
            deltas: list[tuple[dict[str, Any], str | None]] = []
            if not choice.call_id:
                choice.call_id = f"cmpl-{uuid.uuid4()}"
                deltas.append(({"tool_calls": [{"index": 0, "id": choice.call_id, "type": "function", "function": {
                    "name": self.tools.function["name"], "arguments": ""}}]}, None))
            if text or final:
                deltas.append(({"tool_calls": [{"index": 0, "type": "function", "function": {"arguments": text}}]}
                               if text else {},
                               reason))
            return deltas
        assert choice.calls is not None
        pieces = choice.calls.feed(text) + (choice.calls.finish() if final else [])
        if not final:
            return [(piece, None) for piece in pieces]
        reason = "tool_calls" if choice.calls.calls else reason
        if not pieces:
            pieces = [{} if choice.calls.calls else {"content": ""}]
        return [(piece, None) for piece in pieces[:-1]] + [(pieces[-1], reason)]

    def _logprobs(self, entries: list[dict[str, dict[str, Any]]], offset: int) -> dict[str, Any] | None:
        """OpenAI's logprobs for tokens the model reported them for (None unless asked for): chat's ``content``
        list, or completions' ``tokens``, ``token_logprobs``, ``top_logprobs`` and ``text_offset`` (counted
        from ``offset``). Each entry lists the sampled token first, then the most likely ones (the engines'
        convention): the sampled token is the chosen one, and ``top_logprobs`` holds exactly the asked-for
        number of most likely tokens."""
        if self.sampling.logprobs is None:
            return None
        top_count = self.sampling.logprobs
        chosen = [next(iter(entry.values())) for entry in entries]
        ranked = [sorted(entry.values(), key=lambda item: item.get("rank", 1 << 62))[:top_count]
                  for entry in entries]
        if self.chat:
            return {"content": [{
                "token": token["decoded_token"], "logprob": token["logprob"],
                "bytes": list(token["decoded_token"].encode()),
                "top_logprobs": [{"token": top["decoded_token"], "logprob": top["logprob"],
                                  "bytes": list(top["decoded_token"].encode())} for top in tops]}
                for token, tops in zip(chosen, ranked)]}
        offsets = []
        for token in chosen:
            offsets.append(offset)
            offset += len(token["decoded_token"])
        return {"text_offset": offsets, "token_logprobs": [token["logprob"] for token in chosen],
                "tokens": [token["decoded_token"] for token in chosen],
                "top_logprobs": [{top["decoded_token"]: top["logprob"] for top in tops} for tops in ranked]}

    def _chunk(self, choice: Choice, text: str, finish_reason: str | None, *, first: bool = False,
               include_usage: bool = False, delta: dict[str, Any] | None = None,
               logprobs: dict[str, Any] | None = None) -> bytes:
        if self.chat:
            if delta is None:
                delta = {"role": "assistant", "content": text} if first else {"content": text}
            entry: dict[str, Any] = {"index": choice.index, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": finish_reason}
            doc = {**self._head("chat.completion.chunk"), "choices": [entry]}
        else:
            entry = {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
            doc = {**self._head("text_completion"), "choices": [entry]}
        if include_usage:
            doc["usage"] = None
        return _event(doc)

    async def stream(self, choices: list[Choice], include_usage: bool) -> AsyncIterator[bytes]:
        """Every chunk as its SSE event, then the usage chunk (``include_usage``) and ``[DONE]``; a model's error
        ends the stream with an error event."""
        items = _merged(choices)
        try:
            item: _Item | None = await anext(items)
            assert item is not None
            if item[3] is not None:
                raise item[3]  # nothing sent yet: the answer is an HTTP error
            if self.chat:
                for choice in choices:
                    yield self._chunk(choice, "", None, first=True, include_usage=include_usage)
            started: set[int] = set()
            if self.tools.mode == "auto":
                assert self.tools.parser is not None
                for choice in choices:
                    choice.calls = CallStream(self.tools.parser)
            open_choices, cut = len(choices), set()
            while open_choices:
                choice, piece, final, error = item if item is not None else await anext(items)
                item = None
                if choice.index in cut:
                    continue
                if choice.calls is not None and piece is not None and \
                        len(choice.text) + len(piece.text) > self.max_tool_call_parse_bytes:
                    log.warning("a streamed reply to %s passed --max-tool-call-parse-bytes (%d): cut short",
                                self.id, self.max_tool_call_parse_bytes)
                    choice.request.cancel()  # its reply is cut: the model stops generating it
                    cut.add(choice.index)
                    open_choices -= 1
                    yield self._chunk(choice, "", "length", include_usage=include_usage, delta={"content": ""})
                    continue
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
                if self.chat and self.tools.mode != "none":
                    for delta, reason in self._tool_deltas(choice, text, final):
                        yield self._chunk(choice, "", reason, include_usage=include_usage, delta=delta)
                elif text or final:
                    logprobs = self._logprobs(piece.logprobs or [], choice.streamed_chars + len(text) -
                                              len(piece.text)) if piece.logprobs else None
                    choice.streamed_chars += len(text)
                    yield self._chunk(choice, text, choice.finish_reason if final else None,
                                      include_usage=include_usage, logprobs=logprobs)
                if final:
                    open_choices -= 1
            if include_usage:
                yield _event({**self._head("chat.completion.chunk" if self.chat else "text_completion"),
                              "choices": [], "usage": self._usage(choices)})
            yield b"data: [DONE]\n\n"
        finally:
            await items.aclose()


_Item = tuple[Choice, Piece | None, bool, ServerError | None]  # a piece or the error that ended a choice


async def _merged(choices: list[Choice]) -> AsyncGenerator[_Item, None]:
    """Every choice's pieces as they come, each choice ending with its final piece or its error. One choice is
    read directly; several through a queue that a task per choice fills."""
    if len(choices) == 1:
        [choice] = choices
        try:
            async for piece, final in _pieces(choice):
                yield choice, piece, final, None
        except ServerError as error:
            yield choice, None, True, error
        return
    queue: asyncio.Queue[_Item] = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        try:
            async for piece, final in _pieces(choice):
                queue.put_nowait((choice, piece, final, None))
        except ServerError as error:
            queue.put_nowait((choice, None, True, error))

    pumps = [asyncio.create_task(pump(choice)) for choice in choices]
    try:
        while True:
            yield await queue.get()
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


def _model_control_error(message: str, error: ServerError) -> OpenAIError:
    """A failed load or unload: 400 for the client's mistake, 500 for the server's (as Triton's front-end)."""
    client = error.status in (Status.INVALID_ARG, Status.NOT_FOUND, Status.ALREADY_EXISTS)
    return OpenAIError(message, 400 if client else 500)


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
