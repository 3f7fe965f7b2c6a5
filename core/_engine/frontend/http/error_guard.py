"""The HTTP front-end's last line: an exception nothing answered becomes a 500 with Triton's error body."""
from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from ...errors import ServerError, unexpected

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

EVENT_STREAM = b"text/event-stream"


class ErrorGuard:
    """ASGI middleware. An exception that escapes ``app`` (a bug in the front-end, the data plane, a
    scheduler or a backend) is logged once, with its traceback, and answered with status 500 and
    ``{"error": "<type>: <message>"}``; a Server-Sent Events stream already under way ends with that
    error as its last event. The connection stays open for the client's next request."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        progress = _ResponseProgress(send)
        try:
            await self.app(scope, receive, progress.send)
        except Exception as error:
            log.exception("HTTP %s %s failed", scope["method"], scope["path"])
            await progress.finish(unexpected(error))


class _ResponseProgress:
    """Passes a response's messages on, noting how far it got."""

    __slots__ = ("_send", "headers", "complete")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.headers: Iterable[tuple[bytes, bytes]] | None = None  # once the response has started
        self.complete = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.headers = message.get("headers", ())
        elif not message.get("more_body", False):
            self.complete = True
        await self._send(message)

    async def finish(self, error: ServerError) -> None:
        """Answer with ``error``, or end the response already started with it as well as can be."""
        body = json.dumps({"error": error.message}, separators=(",", ":")).encode()
        if self.headers is None:
            await self._send({"type": "http.response.start", "status": error.status.http_status,
                              "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode())]})
            await self._send({"type": "http.response.body", "body": body})
        elif not self.complete:  # only an event stream can still say what went wrong
            streaming = any(key.lower() == b"content-type" and value.startswith(EVENT_STREAM)
                            for key, value in self.headers)
            last = b"data: " + body + b"\n\n" if streaming else b""
            await self._send({"type": "http.response.body", "body": last})
