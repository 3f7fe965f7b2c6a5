"""POST /v2/models/{model}[/versions/{version}]/generate and /generate_stream (Server-Sent Events)."""
from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ...errors import ServerError, internal
from ...inference import InferenceRequest, InferenceResponse
from ...seam import DataPlaneAPI
from .disconnect import DisconnectWatch
from .generate_json import generate_request, generate_response, parse_generate_body
from .headers import header_dict

GENERATE_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/(generate|generate_stream)")
SINGLE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                   "generates various number of responses")
IDENTITY_ONLY = "Unsupported content-encoding, only 'identity' is supported."
EVENT_STREAM = b"text/event-stream; charset=utf-8"
JSON = b"application/json"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ReadBody = Callable[[dict[str, str], Receive], Awaitable[bytes]]
# What the endpoint takes from a request's responses: (response, final), or None once the client left.
_Item = tuple[InferenceResponse | None, bool] | None


class GenerateEndpoint:
    """Serves generate requests through the data plane's one inference path.

    ``/generate`` answers with one JSON object and needs exactly one response from the model (decoupled or
    not); ``/generate_stream`` sends each response as an SSE event, ``data: {...}``, as it comes. A client
    that disconnects cancels its request.
    """

    def __init__(self, dataplane: DataPlaneAPI, read_body: ReadBody, max_input_size: int) -> None:
        self.dataplane = dataplane
        self.read_body = read_body  # the HTTP front-end's, with its size limit
        self.max_input_size = max_input_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send, match: re.Match[str]) -> None:
        if scope["method"] != "POST":
            await _send_whole(send, 405, JSON, _error_json("Method Not Allowed"))
            return
        name, version_text, kind = match[1], match[2], match[3]
        headers = header_dict(scope["headers"])
        try:
            request = await self._request(headers, receive, name, int(version_text) if version_text else None)
            queue: asyncio.Queue[_Item] = asyncio.Queue()
            request.set_sink(lambda response, final: queue.put_nowait((response, final)))
            self.dataplane.submit(request)
        except ServerError as error:
            await _send_whole(send, error.status.http_status, JSON, _error_json(error.message))
            return
        watch = DisconnectWatch(receive, request, lambda: queue.put_nowait(None))
        try:
            if kind == "generate_stream":
                await _stream(send, request, queue)
            else:
                await _reply_once(send, request, queue)
        finally:
            watch.stop()

    async def _request(self, headers: dict[str, str], receive: Receive, name: str,
                       version: int | None) -> InferenceRequest:
        metadata = await self.dataplane.model_metadata(name, version)
        if headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
            raise ServerError(IDENTITY_ONLY)
        body = await self.read_body(headers, receive)
        inputs = {tensor["name"]: tensor for tensor in metadata["inputs"]}
        return generate_request(parse_generate_body(body), inputs, name, version, self.max_input_size)


async def _reply_once(send: Send, request: InferenceRequest, queue: asyncio.Queue[_Item]) -> None:
    """Wait for every response; answer with the one response, its error, or the single-response error."""
    responses: list[InferenceResponse] = []
    while (item := await queue.get()) is not None:
        response, final = item
        if response is not None:
            responses.append(response)
        if final:
            break
    else:
        return  # the client left
    if len(responses) != 1:
        await _send_whole(send, 500, JSON, _error_json(SINGLE_RESPONSE))
        return
    status, body = _encode(responses[0], request)
    await _send_whole(send, status, JSON, body)


async def _stream(send: Send, request: InferenceRequest, queue: asyncio.Queue[_Item]) -> None:
    """Send each response as an SSE event; the first one's status (200 unless it is an error) is the reply's."""
    started = False
    while (item := await queue.get()) is not None:
        response, final = item
        chunk = b""
        status = 200
        if response is not None:
            status, body = _encode(response, request)
            chunk = b"data: " + body + b"\n\n"
        if not started:
            started = True
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", EVENT_STREAM)]})
        if chunk or final:
            await send({"type": "http.response.body", "body": chunk, "more_body": not final})
        if final:
            return


def _encode(response: InferenceResponse, request: InferenceRequest) -> tuple[int, bytes]:
    """A response's status and JSON text; an error response (or one JSON cannot carry) as ``{"error": ...}``."""
    error = response.error
    if error is None:
        try:
            return 200, json.dumps(generate_response(response, request), separators=(",", ":")).encode()
        except ServerError as failed:
            error = failed
        except (TypeError, ValueError) as failed:  # a parameter JSON cannot hold
            error = internal(f"failed to write the generate response: {failed}")
    return error.status.http_status, _error_json(error.message)


def _error_json(message: str) -> bytes:
    return json.dumps({"error": message}, separators=(",", ":")).encode()


async def _send_whole(send: Send, status: int, content_type: bytes, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

