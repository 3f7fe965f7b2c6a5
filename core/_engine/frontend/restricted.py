"""Restricted APIs (``--http-restricted-api``, ``--grpc-restricted-protocol``): Triton's categories, the category of
every route each listener serves (KServe v2 HTTP, SageMaker, Vertex AI, gRPC), and the one header check each
listener runs before a restricted call."""
from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import grpc

from ..errors import ServerError
from .http.app import Receive, Scope, Send

# Triton's restricted categories, in its order (RESTRICTED_CATEGORY_NAMES).
CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
              "statistics", "trace", "logging")
# Triton puts this in front of every --grpc-restricted-protocol key: the metadata the client must send.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

# A restricted category -> (the header a request must carry, the value it must have).
Restrictions = dict[str, tuple[str, str]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def parse_restrictions(flag: str, items: Iterable[str], *, kind: str, header_prefix: str = "") -> Restrictions:
    """Every ``<category>,...:<key>=<value>`` given to the repeatable ``flag`` (``--http-restricted-api``),
    as Triton parses them; ``kind`` ("api" or "protocol") names a category in errors. Raises ServerError
    with Triton's text for a malformed item, an unknown category or one listed twice."""
    restrictions: Restrictions = {}
    for item in items:
        names, colon, setting = item.partition(":")
        key, equals, value = setting.partition("=")
        if not (colon and equals and names and key and value):
            raise ServerError(f"{flag} option format is '<config name>:<setting>=<value>'. Got {item}")
        for name in names.split(","):
            if name not in CATEGORIES:
                raise ServerError(f"{flag}: unknown restricted {kind} '{name}'")
            if name in restrictions:
                raise ServerError(f"{flag}: restricted {kind} '{name}' can not be specified in multiple "
                                  "config groups")
            restrictions[name] = (header_prefix + key, value)
    return restrictions


def restrictions_from_json(value: dict[str, Sequence[str]]) -> Restrictions:
    """Restrictions back from their JSON form (pairs arrive as lists in a front-end process)."""
    return {category: (header, expected) for category, (header, expected) in value.items()}


# ---- HTTP ------------------------------------------------------------------------------------------

_MODEL = r"/v2/models/[^/]+(?:/versions/[0-9]+)?"
# Each endpoint's path and category, in the order Triton's HTTP server dispatches (the first that
# matches the whole path wins), except inference: no other path matches it, and first it is found
# soonest. Endpoints triton-serve does not serve yet are listed too, so they are restricted from the
# day they exist.
_HTTP_ROUTES = (
    (_MODEL + r"/(?:infer|generate|generate_stream)", "inference"),
    (r"/v2/models/stats", "statistics"),
    (r"/v2/logging", "logging"),
    (_MODEL + r"/ready", "health"),
    (_MODEL + r"/config", "model-config"),
    (_MODEL + r"/stats", "statistics"),
    (r"/v2/models/[^/]+/trace/setting", "trace"),
    (_MODEL, "metadata"),
    (r"/v2", "metadata"),
    (r"/v2/health/(?:live|ready)", "health"),
    (r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(?:status|register|unregister)", "shared-memory"),
    (r"/v2/repository(?:/[^/]+)?/(?:index|models/[^/]+/(?:load|unload))", "model-repository"),
    (r"/v2/trace/setting", "trace"),
    # The OpenAI plugin's model control on the HTTP port (Triton serves it on its OpenAI port alone, behind
    # --openai-restricted-api, which applies here too): a model loaded there is loaded for every protocol.
    (r"/v1/models/[^/]+/(?:load|unload)", "model-repository"),
)
_HTTP_PATHS = re.compile("|".join(f"({path})" for path, _category in _HTTP_ROUTES))


def http_category(path: str) -> str | None:
    """The restricted category of an HTTP path; None for a path that is no Triton endpoint."""
    match = _HTTP_PATHS.fullmatch(path)
    return None if match is None else _HTTP_ROUTES[match.lastindex - 1][1]  # type: ignore[operator]


def kserve_category(scope: Scope) -> str | None:
    """The category of a request to the KServe v2 app (the HTTP port, and what a platform listener forwards)."""
    return http_category(scope["path"])


# SageMaker's multi-model routes (Triton's models_regex_): /models, /models/<name>, /models/<name>/invoke.
_SAGEMAKER_MODELS = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")


def sagemaker_category(scope: Scope) -> str | None:
    """The category of a request to a route the SageMaker listener answers itself, as Triton's
    SagemakerAPIServer checks them: ``/ping`` is health; listing, describing, loading (``POST /models``) and
    unloading (``DELETE /models/<name>``) models are model-repository. ``/invocations`` is forwarded to the KServe
    v2 app, whose check sees it as the default model's ``infer`` (or ``generate``); ``POST /models/<name>/invoke``
    answers 404 first (no model is registered at run time), as Triton does for a model it did not load."""
    path, method = scope["path"], scope["method"]
    if path == "/ping":
        return "health"
    if (models := _SAGEMAKER_MODELS.fullmatch(path)) is None:
        return None
    if method in ("GET", "DELETE") or (method == "POST" and not models[2]):
        return "model-repository"
    return None


def vertex_ai_category(health_route: str) -> Callable[[Scope], str | None]:
    """The category of a request to a route the Vertex AI listener answers itself: ``AIP_HEALTH_ROUTE`` is health.
    ``AIP_PREDICT_ROUTE`` is forwarded to the KServe v2 app, whose check sees the default model's ``infer`` or,
    with ``X-Vertex-Ai-Triton-Redirect``, the endpoint the header names (after the listener's own method check,
    as in Triton)."""
    def category(scope: Scope) -> str | None:
        return "health" if scope["path"] == health_route else None
    return category


class RestrictionCheck:
    """The one header check of every HTTP listener: the KServe v2 app on the HTTP port, the SageMaker and Vertex
    AI listeners, and the KServe v2 app they forward to. A request to an endpoint of a restricted category
    without the category's header (any case) set to exactly the expected value gets 403 and
    ``{"error": "This API is restricted, expecting header '<key>'"}``, before any other check (method, body), as
    Triton answers on each of those listeners (``--http-restricted-api`` applies to all of them)."""

    def __init__(self, restrictions: Restrictions) -> None:
        # category -> (header name as ASGI spells it, expected value, the refusal's body)
        self._rules = {
            category: (header.lower().encode(), value.encode(),
                       json.dumps({"error": f"This API is restricted, expecting header '{header}'"}).encode())
            for category, (header, value) in restrictions.items()}

    @property
    def restricts(self) -> bool:
        """Whether any category is restricted."""
        return bool(self._rules)

    def refusal(self, category: str | None, headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
        """The 403 body for a request of ``category`` carrying ``headers`` (ASGI's lower-case names); None when
        it may proceed."""
        rule = self._rules.get(category) if category is not None else None
        if rule is None:
            return None
        header, expected, refusal = rule
        for name, value in headers:
            if name == header:  # the first header of that name decides, as in Triton
                return None if value == expected else refusal
        return refusal

    def guard(self, app: AsgiApp, category_of: Callable[[Scope], str | None]) -> AsgiApp:
        """``app`` behind the check, ``category_of(scope)`` naming each request's category (None: no endpoint
        of a category). Returns ``app`` itself when nothing is restricted."""
        if not self._rules:
            return app

        async def restricted_app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                refusal = self.refusal(category_of(scope), scope["headers"])
                if refusal is not None:
                    await _discard_body(receive)  # hypercorn closes a connection whose request body is unread
                    await send({"type": "http.response.start", "status": 403, "headers": [
                        (b"content-type", b"application/json"), (b"content-length", str(len(refusal)).encode())]})
                    await send({"type": "http.response.body", "body": refusal})
                    return
            await app(scope, receive, send)
        return restricted_app


async def _discard_body(receive: Receive) -> None:
    """Read a refused request's body to its end (or the client's disconnect), keeping none of it."""
    while (await receive()).get("more_body", False):
        pass


# ---- gRPC ------------------------------------------------------------------------------------------

_INFERENCE_SERVICE = "/inference.GRPCInferenceService/"
# Each RPC's category, as Triton's gRPC server registers them (TraceSetting and LogSettings too, served
# or not; the standard health service's Watch, which Triton lacks, goes with its Check).
GRPC_METHOD_CATEGORIES = {
    **{_INFERENCE_SERVICE + rpc: category for category, rpcs in (
        ("health", ("ServerLive", "ServerReady", "ModelReady")),
        ("metadata", ("ServerMetadata", "ModelMetadata")),
        ("inference", ("ModelInfer", "ModelStreamInfer")),
        ("shared-memory", ("SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
                           "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister")),
        ("model-config", ("ModelConfig",)),
        ("model-repository", ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")),
        ("statistics", ("ModelStatistics",)),
        ("trace", ("TraceSetting",)),
        ("logging", ("LogSettings",)),
    ) for rpc in rpcs},
    "/grpc.health.v1.Health/Check": "health",
    "/grpc.health.v1.Health/Watch": "health",
}


class GrpcRestrictionInterceptor(grpc.aio.ServerInterceptor):
    """Ends a call to a restricted RPC with UNAVAILABLE and "This protocol is restricted, expecting header
    '<key>'" unless its metadata carries the expected value, as Triton does; other calls pass untouched."""

    def __init__(self, restrictions: Restrictions) -> None:
        self._rules = {method: restrictions[category] for method, category in GRPC_METHOD_CATEGORIES.items()
                       if category in restrictions}

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        refusal = self.refusal(handler_call_details.method, handler_call_details.invocation_metadata or ())
        return handler if refusal is None else _refusing(handler, refusal)

    def refusal(self, method: str, metadata: Iterable[tuple[str, Any]]) -> str | None:
        """The UNAVAILABLE message for a call to ``method`` with ``metadata``; None when it may proceed
        (both gRPC transports ask this)."""
        rule = self._rules.get(method)
        if rule is None:
            return None
        header, expected = rule
        for key, value in metadata:
            if key == header:  # the first entry of that name decides, as in Triton
                if value == expected:
                    return None
                break
        return f"This protocol is restricted, expecting header '{header}'"


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s shape that ends the call with UNAVAILABLE without reading the request."""
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


def grpc_interceptors(restrictions: Restrictions) -> list[grpc.aio.ServerInterceptor]:
    """The interceptor that enforces ``restrictions``; none (no cost per call) when nothing is restricted."""
    return [GrpcRestrictionInterceptor(restrictions)] if restrictions else []
