"""Calling a bound function, whatever its kind: plain, coroutine, generator or async generator."""
from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from triton_serve.worker import RequestContent

from .proxy.types import Request

_local = threading.local()


def thread_loop() -> asyncio.AbstractEventLoop:
    """This thread's own event loop, for async functions (made at first use; ``close_thread_loop`` ends it)."""
    loop = getattr(_local, "loop", None)
    if loop is None:
        loop = _local.loop = asyncio.new_event_loop()
    return loop


def close_thread_loop() -> None:
    """Close this thread's loop, if it made one."""
    loop = getattr(_local, "loop", None)
    if loop is not None:
        _local.loop = None
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def requests_of(contents: Sequence[RequestContent], default_outputs: Sequence[str]) -> list[Request]:
    """PyTriton's ``Request`` for each request's content (``default_outputs`` where it asks for none)."""
    return [Request({tensor.name: tensor.data for tensor in content.inputs}, dict(content.parameters),
                    requested_output_names=[output.name for output in content.outputs] or list(default_outputs))
            for content in contents]


def results_of(function: Callable[[Any], Any], requests: Any) -> Iterator[Any]:
    """``function(requests)``'s results: one for a function or coroutine, each yielded value for a
    generator or async generator (on this thread's loop: the server's loop never runs user code)."""
    result = function(requests)
    if inspect.iscoroutine(result):
        yield thread_loop().run_until_complete(result)
    elif inspect.isasyncgen(result):
        loop = thread_loop()
        while True:
            try:
                yield loop.run_until_complete(result.__anext__())
            except StopAsyncIteration:
                return
    elif inspect.isgenerator(result):
        yield from result
    else:
        yield result
