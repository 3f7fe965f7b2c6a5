"""The model's line to the server: calls that pb_utils makes from inside a worker (answered by server_calls.py)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from triton_serve.worker import RequestContent, ResponseContent

from ..protocol import CallFailed, InlineContent, Kind, encode
from .errors import CODE_NAMES, TritonError, TritonModelException

_CODES = {name: code for code, name in CODE_NAMES.items()}


class CallChannel(Protocol):
    """What the link sends through: the worker's BlockingChannel."""

    def send(self, frame: bytes) -> None: ...

    def call(self, method: str, *args: Any) -> Any: ...

    def call_stream(self, method: str, *args: Any) -> Iterator[Any]: ...

    def notify(self, method: str, *args: Any) -> None: ...

    def notify_soon(self, method: str, *args: Any) -> None: ...


class ServerLink:
    """Calls to the server on behalf of one model instance; a refused call raises TritonModelException with
    the server's status and Triton's wording (see ``failure``)."""

    def __init__(self, channel: CallChannel, model_instance_name: str,
                 request_type: type[RequestContent] = RequestContent,
                 response_type: type[ResponseContent] = ResponseContent) -> None:
        self._channel = channel
        self.model_instance_name = model_instance_name
        # the server's content types (INIT's content_types), which requests and responses cross in
        self.request_type = request_type
        self.response_type = response_type

    def call(self, method: str, *args: Any) -> Any:
        """Run ``method(*args)`` on the server and return its result; any thread may call."""
        try:
            return self._channel.call(method, *args)
        except CallFailed as failure:
            raise TritonModelException(self.failure(failure.message), _CODES.get(failure.code_name,
                                                                                 TritonError.INTERNAL)) from None

    def call_raw(self, method: str, *args: Any) -> Any:
        """``call`` that lets CallFailed through, for callers that turn it into a response."""
        return self._channel.call(method, *args)

    def call_stream(self, method: str, *args: Any) -> Iterator[Any]:
        """The items of the streaming call ``method(*args)`` as the server sends them; CallFailed ends it."""
        return self._channel.call_stream(method, *args)

    def respond(self, key: int, response: InlineContent | None, final: bool) -> None:
        """Send a response sender's response for the request the server knows as ``key``."""
        self._channel.send(encode(Kind.RESPONSE, (key, response, final)))

    def notify(self, method: str, *args: Any) -> None:
        """Run ``method(*args)`` on the server without waiting for it."""
        self._channel.notify(method, *args)

    def notify_soon(self, method: str, *args: Any) -> None:
        """``notify`` from a finalizer: the message goes with the next one the worker sends."""
        self._channel.notify_soon(method, *args)

    def failure(self, detail: str) -> str:
        """Triton's text for a request the server refused."""
        return f"Failed to process the request for model '{self.model_instance_name}', message: {detail}"


_link: ServerLink | None = None


def set_server_link(link: ServerLink | None) -> None:
    """Connect pb_utils to the server (the worker does, before it loads the model)."""
    global _link
    _link = link


def server_link(feature: str) -> ServerLink:
    """The link, or TritonModelException naming ``feature`` outside a worker (auto_complete_config, a test)."""
    if _link is None:
        raise TritonModelException(f"{feature} works only inside a model that the python backend serves",
                                   TritonError.UNSUPPORTED)
    return _link
