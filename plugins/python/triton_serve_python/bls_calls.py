"""The server's side of business logic scripting: a worker's ``exec`` calls run requests through the in-process
client, so they take the normal inference path (validation, scheduling, batching, statistics)."""
from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncGenerator
from typing import Any

from triton_serve.plugin import InferenceClient, InferenceRequest, ServerError, Status

from .inline import pack, unpack
from .open_requests import OpenRequests
from .protocol import InlineContent

DEFAULT_WAIT_S = 30.0  # how long a BLS request without a timeout waits for each response
_SEQUENCE_START, _SEQUENCE_END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END
_EARLY_CANCELS = 64  # cancel_bls calls kept for streams that have not started yet (older ones are forgotten)


def build_request(packed: dict[str, Any]) -> InferenceRequest:
    """The core request a worker's pb_utils.InferenceRequest describes (bls.pack_request)."""
    request = InferenceRequest.from_content(unpack(InferenceRequest.content_type, packed["content"]))
    request.timeout_us = int(packed["timeout"])
    request.sequence_id = packed["correlation_id"]
    request.sequence_start = bool(packed["flags"] & _SEQUENCE_START)
    request.sequence_end = bool(packed["flags"] & _SEQUENCE_END)
    return request


def _failure(model_name: str, detail: str, status: Status) -> ServerError:
    return ServerError(f"Model {model_name} - Error when running inference: {detail}", status)


class BlsCalls:
    """The ``infer`` and ``infer_stream`` calls of one worker.

    Each response is awaited for at most the request's timeout, or DEFAULT_WAIT_S without one: a model
    that calls itself while its only instance runs the calling ``execute``, or whose callees are all busy
    in BLS calls of their own, gets an error after that bound instead of hanging, and the request is
    cancelled. A call still running when the worker dies is cancelled with its request, and so is one whose
    calling requests (those whose ``execute`` made it) are all cancelled.
    """

    def __init__(self, client: InferenceClient, open_requests: OpenRequests) -> None:
        self._client = client
        self._open_requests = open_requests
        self._streams: dict[Any, InferenceRequest] = {}  # infer_stream calls by the worker's cancel key
        self._early: OrderedDict[Any, None] = OrderedDict()  # keys cancelled before their stream started

    def handlers(self) -> dict[str, Any]:
        return {"infer": self.infer, "infer_stream": self.infer_stream, "cancel_bls": self.cancel_bls}

    def cancel_bls(self, key: Any) -> None:
        """The response iterator's ``cancel()`` (python_backend 25.04, Triton 2.57): cancel that streaming
        request as a client cancels one; the called model sees ``is_cancelled()`` and the stream ends with a
        CANCELLED error."""
        request = self._streams.get(key)
        if request is not None:
            request.cancel()
            return
        self._early[key] = None  # the notification overtook its call
        while len(self._early) > _EARLY_CANCELS:
            self._early.popitem(last=False)

    async def infer(self, packed: dict[str, Any]) -> InlineContent:
        """Run a request on a model that is not decoupled: its one response."""
        request = build_request(packed)
        name = request.model_name
        async with contextlib.aclosing(self._responses(request, packed)) as responses:
            answers = [response async for response in responses]
        sent = [answer for answer in answers if answer is not None]
        if len(sent) > 1:
            raise _failure(name, f"Model {name} is using the decoupled. The current BLS request call doesn't "
                                 "support models using the decoupled transaction policy. Please use "
                                 "'decoupled=True' argument to the 'exec' or 'async_exec' calls for decoupled "
                                 "models.'", Status.INVALID_ARG)
        if not sent:
            raise _failure(name, "Unexpected empty response.", Status.INTERNAL)
        return sent[0]

    def infer_stream(self, packed: dict[str, Any]) -> AsyncGenerator[InlineContent | None, None]:
        """Run a request on a decoupled model: every response as it comes, the last one maybe empty (None)."""
        return self._responses(build_request(packed), packed)

    async def _responses(self, request: InferenceRequest,
                         packed: dict[str, Any]) -> AsyncGenerator[InlineContent | None, None]:
        name = request.model_name
        wait_s = request.timeout_us / 1e6 if request.timeout_us > 0 else DEFAULT_WAIT_S
        # Made with ``trace=request.trace()``: traced as a child of that request when it is traced (Triton's rule).
        traced_for = self._open_requests.find([packed["trace"]]) if packed.get("trace") else []
        try:
            self._client.submit(request, parent=traced_for[0] if traced_for else None)
        except ServerError as error:
            if error.status in (Status.NOT_FOUND, Status.UNAVAILABLE):
                raise _failure(name, f"Failed for execute the inference request. Model '{name}' is not ready.",
                               error.status) from None
            raise _failure(name, error.message, error.status) from None
        responses = request.responses()
        parent_keys = packed.get("parents", ())
        parents = self._open_requests.find(parent_keys)
        watcher = asyncio.get_running_loop().create_task(_cancel_with(parents, request)) if parents else None
        if parent_keys and not parents and all(self._open_requests.is_cancelled(key) for key in parent_keys):
            request.cancel()  # every calling request was cancelled already (and so ended)
        cancel_key = packed.get("cancel_key")
        if cancel_key is not None:
            self._streams[cancel_key] = request
            if self._early.pop(cancel_key, 0) is None:
                request.cancel()
        try:
            while True:
                try:
                    response, final = await asyncio.wait_for(anext(responses), wait_s)
                except asyncio.TimeoutError:
                    raise _failure(name, f"no response within {wait_s:g} s, so the request was cancelled (a "
                                         "BLS request waits that long for each response: its timeout, else "
                                         f"{DEFAULT_WAIT_S:g} s; a model calling itself with no free instance "
                                         "never gets one)", Status.UNAVAILABLE) from None
                yield None if response is None else pack(response.content)
                if final:
                    return
        finally:
            if cancel_key is not None:
                self._streams.pop(cancel_key, None)
            if watcher is not None:
                watcher.cancel()
            if not request.finished:
                request.cancel()


async def _cancel_with(parents: list[InferenceRequest], child: InferenceRequest) -> None:
    """Cancel ``child`` once every one of ``parents`` is cancelled."""
    await asyncio.gather(*(parent.cancelled.wait() for parent in parents))
    child.cancel()
