"""What the SageMaker and Vertex AI listeners share: handing a request on to the KServe v2 app under another
path, and their binary-data MIME type in place of the Inference-Header-Content-Length header."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..http.error_guard import App as ASGIApp, Message, Receive, Scope, Send

HEADER_LENGTH = b"inference-header-content-length"
# Headers the platforms' front-ends do not honour (Triton: identity compression both ways).
DROPPED = {HEADER_LENGTH, b"content-encoding", b"accept-encoding"}


def header(scope: Scope, name: str) -> str | None:
    """The value of request header ``name`` (lower case), or None."""
    wanted = name.encode("latin-1")
    for key, value in scope["headers"]:
        if key.lower() == wanted:
            return str(value.decode("latin-1"))
    return None


def header_length_from_mime(content_type: str | None, mime: str, content_length: int) -> int | None:
    """The JSON header size a platform's binary MIME type (``<mime><size>``) gives, None where the body is
    plain JSON; ValueError with Triton's message where the type or size is wrong."""
    if content_type is None or mime not in content_type:
        return None
    if not content_type.startswith(mime):
        raise ValueError(f"expect MIME type for binary data starts with '{mime}', got: {content_type}")
    text = content_type[len(mime):]
    digits = text.strip()
    size = int(digits) if digits.isdigit() else 0  # atoi: a malformed size reads as 0, as in Triton
    if size < 0 or size > content_length:
        raise ValueError(f"inference header size should be in range (0, {content_length}), got: {text}")
    return size


async def reply(send: Send, status: int, doc: dict[str, Any] | None = None) -> None:
    """A whole response: ``doc`` as JSON, or no body."""
    body = json.dumps(doc, separators=(",", ":")).encode() if doc is not None else b""
    headers = [(b"content-type", b"application/json")] if doc is not None else []
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def forward(app: ASGIApp, scope: Scope, receive: Receive, send: Send, *, path: str, method: str,
                  binary_mime: str | None = None, status_of_error: Callable[[int, bytes], int] | None = None) -> None:
    """Serve the request with ``app`` as ``method path``. With ``binary_mime``, the request's
    ``Content-Type: <binary_mime><size>`` becomes Inference-Header-Content-Length and a binary response's
    header length goes back the same way; ``status_of_error(status, body)`` may change an error's status."""
    headers = [(key, value) for key, value in scope["headers"] if key.lower() not in DROPPED]
    if binary_mime is not None:
        length = header(scope, "content-length")
        try:
            size = header_length_from_mime(header(scope, "content-type"), binary_mime,
                                           int(length) if length and length.isdigit() else 0)
        except ValueError as error:
            await reply(send, 400, {"error": str(error)})
            return
        if size is not None:
            headers.append((HEADER_LENGTH, str(size).encode()))
    inner = dict(scope, path=path, raw_path=path.encode(), method=method, headers=headers, query_string=b"")
    if binary_mime is None and status_of_error is None:
        await app(inner, receive, send)
        return
    start: Message | None = None

    async def translate(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message  # held until the body shows whether it is an error
            return
        if message["type"] == "http.response.body" and start is not None:
            held, start = start, None
            await send(_translated(held, message.get("body", b""), binary_mime, status_of_error))
        await send(message)

    await app(inner, receive, translate)


def _translated(start: Message, body: bytes, binary_mime: str | None,
                status_of_error: Callable[[int, bytes], int] | None) -> Message:
    status = start["status"]
    headers = []
    length = None
    for key, value in start.get("headers", []):
        if key.lower() == HEADER_LENGTH:
            length = value
        elif not (binary_mime is not None and key.lower() == b"content-type"):
            headers.append((key, value))
    if binary_mime is not None:
        content_type = binary_mime.encode() + length if length is not None else b"application/json"
        headers.append((b"content-type", content_type))
    if status >= 400 and status_of_error is not None:
        status = status_of_error(status, body)
    return {**start, "status": status, "headers": headers}
