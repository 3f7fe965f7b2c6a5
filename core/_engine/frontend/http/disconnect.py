"""Cancelling an HTTP request whose client goes away while it waits for its responses."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ...inference import InferenceRequest

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
# Requests answered sooner cost no watching task (one per request costs about a sixth of add_sub's HTTP
# throughput at c=16 on 2 cores: bench/README.md); a disconnect is noticed at most this late. The ASGI
# servers keep a disconnect that came earlier: ``receive`` then reports it at once.
WATCH_AFTER_S = 0.05


class DisconnectWatch:
    """Watches ``receive`` (the body already read) for ``http.disconnect`` from ``WATCH_AFTER_S`` on: if it
    comes before the request has its final response, cancels the request and calls ``then``. Call
    ``stop()`` once the answer is ready."""

    __slots__ = ("receive", "request", "then", "timer", "task")

    def __init__(self, receive: Receive, request: InferenceRequest, then: Callable[[], None] | None = None) -> None:
        self.receive = receive
        self.request = request
        self.then = then
        self.task: asyncio.Task[None] | None = None
        self.timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, self._start)

    def _start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        if not self.request.finished:
            self.request.cancel()
            if self.then is not None:
                self.then()

    def stop(self) -> None:
        self.timer.cancel()
        if self.task is not None:
            self.task.cancel()
