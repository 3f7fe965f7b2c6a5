"""The server's side of response senders: the requests a worker may still answer, by the key it knows them by."""
from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

from triton_serve.plugin import InferenceRequest, InferenceResponse, ServerError, Status

from .inline import unpack
from .protocol import InlineContent

log = logging.getLogger("triton_serve_python")


class OpenRequests:
    """Requests of one worker that are not finished: each gets a key when its batch goes to the worker, and
    leaves once its final response is sent, or once its client cancels it or goes away (Triton keeps such a
    request until the model ends it; here it ends at once, with CANCELLED, so a model that never answers holds
    nothing but its key, which ``is_cancelled`` keeps answering True for until the model ends the request).
    Runs on the server's event loop."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._requests: dict[int, InferenceRequest] = {}
        self._keys = itertools.count(1)
        self._executing: set[int] = set()  # the batch in the worker now: its failure fails those requests
        self._cancelled: set[int] = set()  # keys of requests ended by their cancellation, until the model ends them

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, requests: Sequence[InferenceRequest]) -> list[int]:
        """Keys for a batch about to execute."""
        keys = [next(self._keys) for _ in requests]
        self._requests.update(zip(keys, requests))
        self._executing.update(keys)
        for key, request in zip(keys, requests):
            self._watch(key, request)
        return keys

    def _watch(self, key: int, request: InferenceRequest) -> None:
        """End the request when it is cancelled."""
        request.when_cancelled(lambda: self._end_cancelled(key))

    def _end_cancelled(self, key: int) -> None:
        request = self._requests.pop(key, None)
        if request is None or request.finished:
            return
        self._cancelled.add(key)
        request.fail(ServerError("the request was cancelled", Status.CANCELLED))

    def executed(self, keys: Sequence[int], answered: Sequence[bool]) -> None:
        """The batch of ``keys`` returned: forget the requests ``answered`` by what it returned."""
        self._executing.difference_update(keys)
        for key, done in zip(keys, answered):
            if done:
                self._requests.pop(key, None)
                self._cancelled.discard(key)

    def deliver(self, key: int, packed: InlineContent | None, final: bool) -> None:
        """Send a RESPONSE frame's response to its request (dropped if the request already ended)."""
        request = self._requests.get(key)
        if request is None or request.finished:
            self._requests.pop(key, None)
            if final:
                self._cancelled.discard(key)
            log.debug("dropped a response of %s for a request that already ended", self.label)
            return
        if final:
            del self._requests[key]
        try:
            response = None if packed is None else InferenceResponse.from_content(
                unpack(InferenceResponse.content_type, packed))
        except Exception as error:  # a worker bug must fail the request, not the connection
            request.fail(ServerError(f"unreadable response from the python backend worker for {self.label}: "
                                     f"{type(error).__name__}: {error}", Status.INTERNAL))
            self._requests.pop(key, None)
            return
        request.send(response, final=final)

    def find(self, keys: Sequence[int]) -> list[InferenceRequest]:
        """The open requests among ``keys``."""
        return [self._requests[key] for key in keys if key in self._requests]

    def is_cancelled(self, key: int) -> bool:
        """The ``is_cancelled`` call: whether the client cancelled the request (False once it ended)."""
        if key in self._cancelled:
            return True
        request = self._requests.get(key)
        return request is not None and request.cancelled.is_set()

    def fail_all(self, message: str) -> None:
        """End every open request with ``message`` (the worker died, or the model unloads), except those of
        the executing batch, which fail with the batch."""
        self._cancelled.clear()
        requests = [request for key, request in self._requests.items() if key not in self._executing]
        self._requests = {key: self._requests[key] for key in self._executing if key in self._requests}
        for request in requests:
            request.fail(ServerError(message, Status.INTERNAL))
