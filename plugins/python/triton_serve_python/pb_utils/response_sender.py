"""pb_utils.InferenceResponseSender: how a model answers a request on its own schedule (decoupled models)."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from triton_serve.worker import ServerError, Status

from ..inline import pack
from .contents import response_content
from .errors import TritonModelException
from .server_link import ServerLink

if TYPE_CHECKING:
    from .messages import InferenceResponse

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class InferenceResponseSender:
    """Sends a request's responses to the server from any thread, during ``execute`` or after it returned.

    A decoupled model sends 0..N responses and then the final flag; a model that is not decoupled sends
    exactly one response (with the final flag, or followed by it). Misuse raises TritonModelException with
    Triton's messages.
    """

    def __init__(self, link: ServerLink, key: int, decoupled: bool) -> None:
        self._link = link
        self._key = key
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._sent = 0
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send ``response`` (None: only the flag); ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` ends the request."""
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException("Inference Response object must be provided when the response flags is "
                                       "set to zero.")
        packed = None if response is None else pack(response_content(response, self._link.response_type))
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            self._count(response is not None, final)
            self._link.respond(self._key, packed, final)

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request (asks the server)."""
        return bool(self._link.call("is_cancelled", self._key))

    def _count(self, has_response: bool, final: bool) -> None:
        """Check a response against what was sent before and record it (callers hold the lock)."""
        if not self._decoupled:
            if has_response and self._sent > 0:
                raise TritonModelException("Unable to send response. Non-decoupled model cannot send more than "
                                           "one response.")
            if not has_response and final and self._sent == 0:
                raise TritonModelException("Unable to send response. Non-decoupled model cannot send complete "
                                           "final before sending a response.")
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        self._sent += has_response
        self._closed = final

    def _returned(self) -> None:
        """Record the response ``execute`` returned for this request (a final one)."""
        with self._lock:
            self._count(True, True)

    def _fail(self, message: str) -> None:
        """End the request with an INTERNAL error ``message``, unless its final response went already (its
        decoupled ``async def execute`` failed in the background)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            failed = self._link.response_type(error=ServerError(message, Status.INTERNAL))
            self._link.respond(self._key, pack(failed), True)

    def _close(self) -> None:
        """No more responses: the batch failed, so the server answered every request."""
        with self._lock:
            self._closed = True
