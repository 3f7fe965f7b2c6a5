"""The Vertex AI listener (``--allow-vertex-ai``): ``AIP_HEALTH_ROUTE`` and ``AIP_PREDICT_ROUTE``, the latter
inferring the default model or, with ``X-Vertex-Ai-Triton-Redirect`` on a POST, serving the read-only KServe v2
route it names (the KServe v2 app it forwards to runs the ``--http-restricted-api`` check) or ``metrics``, the
metrics port's text."""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from ...errors import ServerError, Status
from ...seam import PROMETHEUS_TEXT, DataPlaneAPI
from .forwarding import ASGIApp, Receive, Scope, Send, forward, header, reply

log = logging.getLogger("triton_serve")

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT_HEADER = "X-Vertex-Ai-Triton-Redirect"
DEFAULT_PORT = 8080
# Triton's HTTP routes a redirect may name, and the method each is served with.
MODEL_ROUTE = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(infer|generate|generate_stream|ready|config"
                         r"|stats|trace/setting))?")
SERVER_ROUTE = re.compile(r"/v2(?:/health/(live|ready))?")
SHARED_MEMORY_ROUTE = re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(status|register|unregister)")
REPOSITORY_ROUTE = re.compile(r"/v2/repository(?:/[^/]+)?/(index|models/[^/]+/(?:load|unload))")


@dataclass(frozen=True)
class VertexAiSettings:
    """The routes Vertex AI gives through ``AIP_PREDICT_ROUTE`` and ``AIP_HEALTH_ROUTE``, and the default model."""

    predict_route: str
    health_route: str
    default_model: str = ""  # --vertex-ai-default-model; "" : the repository's only model

    @classmethod
    def from_environment(cls, default_model: str) -> VertexAiSettings:
        predict = os.environ.get("AIP_PREDICT_ROUTE", "")
        health = os.environ.get("AIP_HEALTH_ROUTE", "")
        if not predict:  # Triton's message, its misspelt variable name included
            raise ServerError("API_PREDICT_ROUTE is not defined for Vertex AI endpoint")
        if not health:
            raise ServerError("AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint")
        return cls(predict, health, default_model)


async def resolve_default_model(api: DataPlaneAPI, settings: VertexAiSettings) -> str:
    """The model the predict route infers: the named default, which must be ready, or else the repository's
    only ready model; Triton's start-up errors otherwise."""
    ready = [entry["name"] for entry in await api.repository_index(True)]  # positional: forwarded as is
    if not settings.default_model:
        if len(ready) != 1:
            raise ServerError("Expect the model repository contains only a single model if default model is not "
                              "specified", Status.INVALID_ARG)
        return ready[0]
    if settings.default_model not in ready:
        raise ServerError(f"Expect the default model '{settings.default_model}' is loaded", Status.INVALID_ARG)
    return settings.default_model


def redirect_blocked(endpoint: str) -> bool:
    """Whether a redirect names an endpoint that changes state (shared memory register and unregister, model
    load and unload): refused with 403 whatever the headers, as in Triton since 2.68; those need the HTTP port."""
    shared = SHARED_MEMORY_ROUTE.fullmatch(endpoint)
    if shared is not None:
        return shared[1] != "status"
    repository = REPOSITORY_ROUTE.fullmatch(endpoint)
    return repository is not None and repository[1] != "index"


def redirect_method(endpoint: str) -> str | None:
    """The method Triton serves a redirected ``endpoint`` with (Vertex AI only sends POST), None where a
    redirect may not name it."""
    if endpoint == "/v2/models/stats":
        return "GET"
    if (model := MODEL_ROUTE.fullmatch(endpoint)) is not None:
        kind = model[3] or ""
        return {"infer": "POST", "ready": "GET", "config": "GET", "stats": "GET", "": "GET"}.get(kind)
    if SERVER_ROUTE.fullmatch(endpoint) is not None:
        return "GET"
    if (shared := SHARED_MEMORY_ROUTE.fullmatch(endpoint)) is not None and shared[1] == "status":
        return "GET"
    if (repository := REPOSITORY_ROUTE.fullmatch(endpoint)) is not None and repository[1] == "index":
        return "POST"
    return None


def vertex_ai_app(api: DataPlaneAPI, triton: ASGIApp, settings: VertexAiSettings, default_model: str) -> ASGIApp:
    """The Vertex AI routes as an ASGI app; ``triton`` is the KServe v2 app that serves what they ask."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        log.debug("Vertex AI request: %s %s", method, path)
        if path == settings.health_route:
            if method != "GET":
                await reply(send, 405, {"error": "Method Not Allowed"})
            else:
                await reply(send, 200 if await api.server_ready() else 400)
            return
        if path == settings.predict_route:
            redirect = header(scope, REDIRECT_HEADER.lower())
            if redirect is None:
                await forward(triton, scope, receive, send, path=f"/v2/models/{default_model}/infer", method=method,
                              binary_mime=BINARY_MIME)
                return
            endpoint = "/" + redirect
            log.debug("Redirecting Vertex AI request: %s", endpoint)
            if method != "POST":
                await reply(send, 405)
                return
            if redirect_blocked(endpoint):
                log.debug("Vertex AI redirect blocked: %s", endpoint)
                await reply(send, 403)
                return
            if endpoint == "/metrics":
                await _reply_metrics(api, send)
                return
            served_as = redirect_method(endpoint)
            if served_as is not None:
                await forward(triton, scope, receive, send, path=endpoint, method=served_as,
                              binary_mime=BINARY_MIME if endpoint.endswith("/infer") else None)
                return
        await reply(send, 400)

    return app


async def _reply_metrics(api: DataPlaneAPI, send: Send) -> None:
    """A redirect to ``metrics``: what the metrics port serves, or, with metrics off, 400 with no body, as in
    Triton."""
    try:
        text = await api.metrics_text()
    except ServerError:
        await reply(send, 400)
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", PROMETHEUS_TEXT.encode()), (b"content-length", str(len(text)).encode())]})
    await send({"type": "http.response.body", "body": text})
