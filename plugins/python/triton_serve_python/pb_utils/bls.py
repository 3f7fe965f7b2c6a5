"""Business logic scripting: a model's ``InferenceRequest.exec()`` runs another model of the same server."""
from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ..inline import pack, unpack
from ..protocol import CallFailed, InlineContent
from .contents import pb_response, request_content
from .errors import CODE_NAMES, TritonError
from .server_link import server_link

if TYPE_CHECKING:
    from .messages import InferenceRequest, InferenceResponse

_CODES = {name: code for code, name in CODE_NAMES.items()}
# The server's keys of the requests whose ``execute`` is running in this context (the runner sets them; tasks
# and ``asyncio.to_thread`` inherit them): a BLS request made there is cancelled when they all are.
calling_requests: ContextVar[tuple[int, ...]] = ContextVar("calling_requests", default=())
_cancel_keys = itertools.count(1)  # names this worker's streaming BLS requests for ResponseIterator.cancel


def unpack_response(packed: InlineContent | None) -> InferenceResponse:
    """A BLS call's pb_utils response from the frames' form (None: an empty last response of a stream); its
    outputs are writable, as the model's own arrays."""
    from .messages import InferenceResponse

    if packed is None:
        return InferenceResponse([])
    return pb_response(unpack(server_link("InferenceRequest.exec").response_type, packed, writable=True))


def pack_request(request: InferenceRequest) -> dict[str, Any]:
    """What the server's ``infer`` call needs to build the request: its content, and its scheduling fields."""
    link = server_link("InferenceRequest.exec")
    return {
        "content": pack(request_content(request, link.request_type)),
        "correlation_id": request.correlation_id(), "flags": request.flags(), "timeout": request.timeout(),
        "parents": list(calling_requests.get()), "trace": request.trace()._request_key,
    }


def _failed(failure: CallFailed) -> InferenceResponse:
    from .messages import InferenceResponse

    return InferenceResponse(error=TritonError(failure.message, _CODES.get(failure.code_name, TritonError.INTERNAL)))


def execute(request: InferenceRequest) -> InferenceResponse:
    """Run ``request`` and return its one response; a failure comes back as a response with an error."""
    try:
        return unpack_response(server_link("InferenceRequest.exec").call_raw("infer", pack_request(request)))
    except CallFailed as failure:
        return _failed(failure)


class ResponseIterator:
    """What ``exec(decoupled=True)`` returns: the responses of a decoupled model as they come, the last one
    possibly empty. ``cancel()`` (python_backend 25.04, Triton 2.57) cancels the request unless its last
    response came already, as a client cancels one: the called model sees ``is_cancelled()``, and the
    iterator ends with a CANCELLED error response (Triton's yields what the model still sends until it ends
    the request; here, as for a client's cancellation, those later responses are dropped)."""

    def __init__(self, request: InferenceRequest) -> None:
        self._key = next(_cancel_keys)
        self._responses = self._stream(request)
        self._finished = False

    def _stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]:
        packed = {**pack_request(request), "cancel_key": self._key}
        try:
            for response in server_link("InferenceRequest.exec").call_stream("infer_stream", packed):
                yield unpack_response(response)
        except CallFailed as failure:
            yield _failed(failure)

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        try:
            return next(self._responses)
        except StopIteration:
            self._finished = True
            raise

    def cancel(self) -> None:
        """Cancel the request, as a client cancels one; nothing once its last response came."""
        if not self._finished:
            server_link("ResponseIterator.cancel").notify("cancel_bls", self._key)


def execute_streaming(request: InferenceRequest) -> ResponseIterator:
    """Run ``request`` on a decoupled model: its responses as they come, the last one possibly empty."""
    return ResponseIterator(request)


class _Collected(ResponseIterator):
    """``async_exec(decoupled=True)``'s iterator: every response was read before it returned, so, as for
    python_backend's iterator once its last response came, ``cancel()`` does nothing."""

    def __init__(self, responses: list[InferenceResponse]) -> None:
        self._responses = iter(responses)
        self._finished = True


async def execute_async(request: InferenceRequest, decoupled: bool) -> Any:
    """``exec`` in a thread, so an ``async def execute`` can await several requests at once."""
    if decoupled:
        return _Collected(await asyncio.to_thread(lambda: list(execute_streaming(request))))
    return await asyncio.to_thread(execute, request)
