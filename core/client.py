"""The in-process client: how schedulers and backends send requests to other models of this server."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from .errors import ServerError, Status
from .inference import InferenceRequest, InferenceResponse

Submit = Callable[[InferenceRequest], None]


class InferenceClient:
    """Sends requests to this server's models through the one inference path, as a front-end does:
    validation, the response cache, the model's scheduler (batching, rate limiting) and statistics
    all apply. Use it on the server's event loop.

    The data plane binds it when the server starts; a client used before that raises UNAVAILABLE.
    """

    def __init__(self) -> None:
        self._submit: Submit | None = None

    def bind(self, submit: Submit) -> None:
        """Route requests to ``submit`` (the data plane's; called once, when the server is built)."""
        self._submit = submit

    def submit(self, request: InferenceRequest) -> None:
        """Start ``request``; read its 0..N responses with ``request.responses()``. Raises ServerError
        when it cannot start (unknown model, invalid input, full queue)."""
        if self._submit is None:
            raise ServerError("the server's inference path is not running yet", Status.UNAVAILABLE)
        self._submit(request)

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """The one response of a request to a non-decoupled model; an error response raises it."""
        self.submit(request)
        response = await request.single_response()
        if response.error is not None:
            raise response.error
        return response

    async def stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """Every response of a request (a decoupled model sends 0..N); an error response raises it."""
        self.submit(request)
        async for response, _final in request.responses():
            if response is None:
                continue
            if response.error is not None:
                raise response.error
            yield response
