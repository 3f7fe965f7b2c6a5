"""The in-process client: how schedulers and backends send requests to other models of this server."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from .errors import ServerError, Status
from .inference import InferenceRequest, InferenceResponse
from .tracing import inherit

if TYPE_CHECKING:
    from .protos.model_config_pb2 import ModelConfig

Submit = Callable[[InferenceRequest], None]
# The completed config of a loaded model version (None: the latest ready one); raises as a request would.
ConfigLookup = Callable[[str, "int | None"], "ModelConfig"]


class InferenceClient:
    """Sends requests to this server's models through the one inference path, as a front-end does:
    validation, the response cache, the model's scheduler (batching, rate limiting) and statistics
    all apply. Use it on the server's event loop.

    The data plane binds it when the server starts; a client used before that raises UNAVAILABLE.
    """

    def __init__(self, configs: ConfigLookup | None = None) -> None:
        self._submit: Submit | None = None
        self._configs = configs

    def bind(self, submit: Submit) -> None:
        """Route requests to ``submit`` (the data plane's; called once, when the server is built)."""
        self._submit = submit

    def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        """The completed config of a loaded version of model ``name`` (the latest ready one when
        ``version`` is None); an unknown or unready model raises ServerError as a request would."""
        if self._configs is None:
            raise ServerError("this client cannot read model configs", Status.UNAVAILABLE)
        return self._configs(name, version)

    def submit(self, request: InferenceRequest, parent: InferenceRequest | None = None) -> None:
        """Start ``request``; read its 0..N responses with ``request.responses()``. Raises ServerError
        when it cannot start (unknown model, invalid input, full queue). ``parent``: the request this one
        is sent for (an ensemble request for its steps, a BLS caller's request); when that request is
        traced, this one is traced as its child (requests sent here are never sampled on their own)."""
        if self._submit is None:
            raise ServerError("the server's inference path is not running yet", Status.UNAVAILABLE)
        inherit(request, parent)
        self._submit(request)

    async def infer(self, request: InferenceRequest, parent: InferenceRequest | None = None) -> InferenceResponse:
        """The one response of a request to a non-decoupled model; an error response raises it."""
        self.submit(request, parent)
        response = await request.single_response()
        if response.error is not None:
            raise response.error
        return response

    async def stream(self, request: InferenceRequest,
                     parent: InferenceRequest | None = None) -> AsyncIterator[InferenceResponse]:
        """Every response of a request (a decoupled model sends 0..N); an error response raises it."""
        self.submit(request, parent)
        async for response, _final in request.responses():
            if response is None:
                continue
            if response.error is not None:
                raise response.error
            yield response
