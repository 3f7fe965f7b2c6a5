"""The server's side of worker -> server calls: CALL and NOTIFY messages run named handlers on the event loop."""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from triton_serve.plugin import ServerError

from .protocol import Kind, encode

log = logging.getLogger("triton_serve_python")
Handler = Callable[..., Any]  # called with the message's arguments; raises ServerError to fail the call


class WorkerCalls:
    """Answers one worker's calls with ``handlers`` (method name -> handler), on the server's event loop.

    A CALL gets a REPLY frame through ``send``: the handler's result (a value marshal can write), or the
    error's message and status (a ServerError keeps both; anything else is INTERNAL). A NOTIFY gets no
    answer, so a failing one is logged. Handlers run between the worker's other messages, in the order the
    worker sent them, and must not block.
    """

    def __init__(self, label: str, handlers: Mapping[str, Handler], send: Callable[[bytes], None]) -> None:
        self.label = label
        self._handlers = dict(handlers)
        self._send = send

    def on_call(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            frame = encode(Kind.REPLY, (call_id, self._run(method, args), None))
        except ServerError as error:
            frame = encode(Kind.REPLY, (call_id, None, (error.message, error.status.name)))
        except Exception as error:
            log.exception("call %s from the python backend worker for %s failed", method, self.label)
            frame = encode(Kind.REPLY, (call_id, None, (f"{type(error).__name__}: {error}", "INTERNAL")))
        self._send(frame)

    def on_notify(self, method: str, args: tuple[Any, ...]) -> None:
        try:
            self._run(method, args)
        except Exception as error:
            log.warning("%s from the python backend worker for %s failed: %s", method, self.label,
                        error.message if isinstance(error, ServerError) else f"{type(error).__name__}: {error}")

    def _run(self, method: str, args: tuple[Any, ...]) -> Any:
        handler = self._handlers.get(method)
        if handler is None:
            raise ServerError(f"the server has no call '{method}' for python backend workers")
        return handler(*args)
