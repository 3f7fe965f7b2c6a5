"""The server's side of worker -> server calls: CALL and NOTIFY messages run named handlers on the event loop."""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from triton_serve.plugin import ServerError, Status

from .protocol import Kind, encode

log = logging.getLogger("triton_serve_python")
# Called with the message's arguments; returns a value, a coroutine of one, or an async generator of items
# (a streaming call); raises ServerError to fail the call.
Handler = Callable[..., Any]


class WorkerCalls:
    """Answers one worker's calls with ``handlers`` (method name -> handler), on the server's event loop.

    A CALL gets a REPLY frame through ``send``: the handler's result (a value marshal can write), or the
    error's message and status (a ServerError keeps both; anything else is INTERNAL). A NOTIFY gets no
    answer, so a failing one is logged. Handlers run between the worker's other messages, in the order the
    worker sent them, and must not block. A handler that returns a coroutine is awaited in a task, so the
    worker's other messages go on meanwhile; one that returns an async generator streams: a PART frame per
    item, then the REPLY. ``close`` cancels the calls still running.
    """

    def __init__(self, label: str, handlers: Mapping[str, Handler], send: Callable[[bytes], None]) -> None:
        self.label = label
        self._handlers = dict(handlers)
        self._send = send
        self._tasks: set[asyncio.Task[None]] = set()

    def on_call(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            result = self._run(method, args)
        except Exception as error:
            self._send(self._failure(call_id, method, error))
            return
        if inspect.iscoroutine(result) or isinstance(result, AsyncGenerator):
            task = asyncio.get_running_loop().create_task(self._answer_later(call_id, method, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._send(self._reply(call_id, result))

    def close(self) -> None:
        """Cancel the calls still running (the worker is gone)."""
        for task in list(self._tasks):
            task.cancel()

    async def _answer_later(self, call_id: int, method: str, pending: Any) -> None:
        try:
            if isinstance(pending, AsyncGenerator):
                async with contextlib.aclosing(pending):  # a cancelled call closes it at once
                    async for item in pending:
                        self._send(encode(Kind.PART, (call_id, item)))
                result = None
            else:
                result = await pending
        except Exception as error:
            self._send(self._failure(call_id, method, error))
            return
        self._send(self._reply(call_id, result))

    def _reply(self, call_id: int, result: Any) -> bytes:
        try:
            return encode(Kind.REPLY, (call_id, result, None))
        except ValueError as error:
            return self._failure(call_id, "reply", error)

    def _failure(self, call_id: int, method: str, error: Exception) -> bytes:
        if isinstance(error, ServerError):
            return encode(Kind.REPLY, (call_id, None, (error.message, error.status.name)))
        log.error("call %s from the python backend worker for %s failed", method, self.label, exc_info=error)
        return encode(Kind.REPLY, (call_id, None, (f"{type(error).__name__}: {error}", "INTERNAL")))

    def on_notify(self, method: str, args: tuple[Any, ...]) -> None:
        try:
            self._run(method, args)
        except Exception as error:
            log.warning("%s from the python backend worker for %s failed: %s", method, self.label,
                        error.message if isinstance(error, ServerError) else f"{type(error).__name__}: {error}")

    def _run(self, method: str, args: tuple[Any, ...]) -> Any:
        handler = self._handlers.get(method)
        if handler is None:
            raise ServerError(f"the server has no call '{method}' for python backend workers", Status.INTERNAL)
        return handler(*args)
