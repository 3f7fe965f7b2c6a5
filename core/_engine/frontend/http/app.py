"""Starlette routes for the HTTP front-end; each handler translates JSON and calls the data plane."""
from __future__ import annotations

import gzip
import json
import logging
import re
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...seam import DataPlaneAPI
from ... import request_json
from ...errors import ServerError, Status
from ...inference import InferenceRequest, InferenceResponse
from ...protos.model_config_pb2 import ModelConfig
from ..header_forwarding import HeaderForwarder
from ..inflate import WBITS, BudgetSpent, InflateBudget, TooLarge, Undecodable
from ...load_overrides import decode_file_parameters
from ...trace_settings import update_from_json
from ..trace import TRACEPARENT, FrontendTrace
from .codec import encode_response, parse_raw_binary, parse_request, split_body
from .disconnect import DisconnectWatch
from .error_guard import ErrorGuard
from .generate import GENERATE_PATH, GenerateEndpoint
from .headers import header_dict
from .shared_memory import SharedMemoryRoutes

log = logging.getLogger(__name__)

HEADER_LENGTH = "inference-header-content-length"
DECOUPLED_ERROR = "HTTP end point doesn't support models with decoupled transaction policy"
DEFAULT_MAX_INPUT_SIZE = 1 << 26
# POST /v2/models/{model}[/versions/{version}]/infer, served by the raw ASGI path.
INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _error(message: str, status: int) -> Response:
    """Triton's error body (ASCII JSON: a message quoting a client's lone surrogate still encodes)."""
    return Response(error_body(message), status, media_type="application/json")


def is_raw_binary(headers: dict[str, str]) -> bool:
    """Inference-Header-Content-Length: 0: the body is the raw data of the model's only input."""
    length = headers.get(HEADER_LENGTH)
    return length is not None and length.strip() == "0"


def _version(request: Request) -> int | None:
    raw = request.path_params.get("version")
    return int(raw) if raw is not None else None


def http_asgi_app(dataplane: DataPlaneAPI, max_input_size: int = DEFAULT_MAX_INPUT_SIZE) -> Callable[
        [Scope, Receive, Send], Awaitable[None]]:
    """The HTTP/REST front-end as an ASGI app answering from ``dataplane`` (to serve it in another host)."""
    return HttpFrontend(dataplane, max_input_size).app()


class HttpFrontend:
    """Builds the ASGI app; ``max_input_size`` bounds request bodies (``--http-max-input-size``)."""

    def __init__(self, dataplane: DataPlaneAPI, max_input_size: int = DEFAULT_MAX_INPUT_SIZE, *,
                 header_forwarder: HeaderForwarder | None = None,
                 mounts: dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]] | None = None) -> None:
        self.dataplane = dataplane
        self.max_input_size = max_input_size
        self.inflate_budget = InflateBudget(max_input_size)  # compressed bodies held inflated (decoded_body)
        self.header_forwarder = header_forwarder  # --http-header-forward-pattern
        self.mounts = mounts or {}  # path prefix -> a plugin's ASGI app (tserve_register_http_apps)

    def app(self) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        """The ASGI app: ``POST .../infer`` and the generate extension on lean raw-ASGI paths, every other
        route through starlette; an exception none of them answers is a 500 (``ErrorGuard``)."""
        routes = self._routes()
        generate = GenerateEndpoint(self.dataplane, self._read_body, self.max_input_size)

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                log.debug("HTTP request: %s %s", scope["method"], scope["path"])  # verbose, as Triton's
            match = INFER_PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
            if match is None:
                generating = GENERATE_PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
                if generating is not None:
                    await generate(scope, receive, send, generating)
                elif self.mounts and (mounted := self._mounted(scope)) is not None:
                    await mounted(scope, receive, send)
                else:
                    await routes(scope, receive, send)
            elif scope["method"] == "POST":
                await self._infer(scope, receive, send, match[1], match[2])
            else:
                await _send_json(send, 405, {"error": "Method Not Allowed"})
        return ErrorGuard(app)

    def _mounted(self, scope: Scope) -> Callable[[Scope, Receive, Send], Awaitable[None]] | None:
        """The plugin app serving this request's path, if a plugin registered a prefix of it."""
        if scope["type"] != "http":
            return None
        path = scope["path"]
        for prefix, mounted in self.mounts.items():
            if path.startswith(prefix) or path == prefix[:-1]:
                return mounted
        return None

    def _routes(self) -> Starlette:
        model = "/v2/models/{model}"
        versioned = "/v2/models/{model}/versions/{version:int}"
        routes = [
            Route("/v2/health/live", self.live, methods=["GET"]),
            Route("/v2/health/ready", self.ready, methods=["GET"]),
            Route("/v2", self.server_metadata, methods=["GET"]),
            Route("/v2/models/stats", self.model_statistics, methods=["GET"]),
            Route("/v2/logging", self.log_settings, methods=["GET", "POST"]),
            Route("/v2/trace/setting", self.trace_setting, methods=["GET", "POST"]),
            Route("/v2/models/{model}/trace/setting", self.trace_setting, methods=["GET", "POST"]),
            Route("/v2/repository/index", self.repository_index, methods=["POST"]),
            Route("/v2/repository/models/{model}/load", self.load, methods=["POST"]),
            Route("/v2/repository/models/{model}/unload", self.unload, methods=["POST"]),
            Route("/v2/repository/{repository}/index", self.repository_index, methods=["POST"]),
            Route("/v2/repository/{repository}/models/{model}/load", self.load, methods=["POST"]),
            Route("/v2/repository/{repository}/models/{model}/unload", self.unload, methods=["POST"]),
            *SharedMemoryRoutes(self.dataplane, self._json_body).routes(),
        ]
        for prefix in (model, versioned):
            routes += [
                Route(prefix, self.model_metadata, methods=["GET"]),
                Route(prefix + "/ready", self.model_ready, methods=["GET"]),
                Route(prefix + "/config", self.model_config, methods=["GET"]),
                Route(prefix + "/stats", self.model_statistics, methods=["GET"]),
            ]
        # The guard also sits inside starlette, whose outermost layer would answer first, in plain text.
        return Starlette(routes=routes, middleware=[Middleware(ErrorGuard)], exception_handlers={
            ServerError: self._server_error, HTTPException: self._http_error})

    @staticmethod
    async def _server_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, ServerError)
        return _error(error.message, error.status.http_status)

    @staticmethod
    async def _http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        return _error(error.detail, error.status_code)

    # ---- health and metadata ----------------------------------------------------------------

    async def live(self, request: Request) -> Response:
        return Response(status_code=200 if await self.dataplane.live() else 400)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if await self.dataplane.server_ready() else 400)

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse(await self.dataplane.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        return JSONResponse(await self.dataplane.model_metadata(request.path_params["model"], _version(request)))

    async def model_ready(self, request: Request) -> Response:
        if await self.dataplane.model_ready(request.path_params["model"], _version(request)):
            return Response(status_code=200)
        return _error("Model version not ready", 400)

    async def model_config(self, request: Request) -> Response:
        return JSONResponse(await self.dataplane.model_config_json(request.path_params["model"], _version(request)))

    async def model_statistics(self, request: Request) -> Response:
        stats = await self.dataplane.model_statistics(request.path_params.get("model", ""), _version(request))
        return JSONResponse({"model_stats": stats})

    async def log_settings(self, request: Request) -> Response:
        """GET: the log settings; POST: change those the JSON body names (null leaves one as it is, as Triton)."""
        if request.method != "POST":
            return JSONResponse(await self.dataplane.log_settings())
        doc = await self._json_body(request)
        changes = {name: value for name, value in doc.items() if value is not None}
        return JSONResponse(await self.dataplane.update_log_settings(changes))

    async def trace_setting(self, request: Request) -> Response:
        """GET: the trace settings (the model's, or the global ones); POST: change those the JSON body names
        first. Values are strings, ``trace_level`` a list of them."""
        update = update_from_json(await self._body(request)) if request.method == "POST" else None
        settings = await self.dataplane.trace_setting(request.path_params.get("model", ""), update)
        return JSONResponse({key: values if key == "trace_level" else values[-1] for key, values in settings.items()})

    # ---- inference --------------------------------------------------------------------------

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_input_size:
            raise self.too_large(int(declared))
        body, inflated = self.decoded_body(await request.body(), request.headers.get("content-encoding", ""))
        self.inflate_budget.give_back(inflated)  # the routes that read it parse it before any other request runs
        return body

    def decoded_body(self, body: bytes, encoding: str) -> tuple[bytes, int]:
        """The body within ``--http-max-input-size``, decompressed per its Content-Encoding, and the bytes counted
        as held inflated, to give back to ``inflate_budget`` once the request is answered: the bodies all requests
        hold inflated (in this front-end process) together stay within one maximum input size."""
        if len(body) > self.max_input_size:
            raise self.too_large(len(body))
        encoding = encoding.strip().lower()
        if encoding in ("", "identity"):
            return body, 0
        wbits = WBITS.get(encoding)
        if wbits is None:
            raise ServerError(f"unsupported Content-Encoding '{encoding}'; use gzip or deflate", Status.UNSUPPORTED)
        try:
            inflated = self.inflate_budget.inflate(body, wbits)
        except Undecodable as error:
            raise ServerError(f"failed to decompress the {encoding} request body: {error}") from None
        except TooLarge as error:
            raise self.too_large(error.size) from None
        except BudgetSpent:
            raise ServerError(f"decompressed request bodies in flight would exceed the server's limit "
                              f"({self.max_input_size} bytes, --http-max-input-size); retry when fewer are in flight",
                              Status.UNAVAILABLE) from None
        return inflated, len(inflated)

    def too_large(self, size: int) -> ServerError:
        return ServerError(f"request body of {size} bytes exceeds the maximum input size of "
                           f"{self.max_input_size} bytes (--http-max-input-size)")

    async def _infer(self, scope: Scope, receive: Receive, send: Send, name: str, version_text: str | None) -> None:
        """POST .../infer without starlette's Request and Response objects: one dict of headers, the body
        read straight from ``receive``, the response sent as one start and one body message. While tracing
        is armed, the request's HTTP timestamps are noted for its trace."""
        headers = header_dict(scope["headers"])
        trace = FrontendTrace(headers.get(TRACEPARENT), "HTTP_RECV_START") if self.dataplane.trace_armed else None
        try:
            status, response_headers, payload = await self._reply(headers, receive, name, version_text, trace)
            if "transfer-encoding" in headers and "content-length" in headers:  # framed twice: RFC 9112 6.3
                response_headers.append((b"connection", b"close"))
            if trace is not None:
                trace.stamp("HTTP_SEND_START")
            await _send(send, status, response_headers, payload)
        finally:
            if trace is not None:
                trace.finish("HTTP_SEND_END")

    async def _reply(self, headers: dict[str, str], receive: Receive, name: str, version_text: str | None,
                     trace: FrontendTrace | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The status, headers and body that answer an inference request."""
        try:
            payload, response_headers = await self._run_infer(headers, receive, name,
                                                               int(version_text) if version_text else None, trace)
        except ServerError as error:
            return _json_reply(error.status.http_status, {"error": error.message})
        return 200, response_headers, payload

    async def _run_infer(self, headers: dict[str, str], receive: Receive, name: str, version: int | None,
                         trace: FrontendTrace | None) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        body = await self._read_body(headers, receive)
        body, inflated = self.decoded_body(body, headers.get("content-encoding", ""))
        try:
            if trace is not None:
                trace.stamp("HTTP_RECV_END")
            config = await self.dataplane.model_config(name, version) if is_raw_binary(headers) else None
            infer_request = self.prepare_infer(headers, body, name, version, config)
            infer_request.trace = trace
            self.dataplane.submit(infer_request, decoupled_error=DECOUPLED_ERROR)
            watch = DisconnectWatch(receive, infer_request)  # a client that leaves cancels its request
            try:
                response = await infer_request.single_response()
            finally:
                watch.stop()
        finally:
            self.inflate_budget.give_back(inflated)
        if response.error is not None:
            raise response.error
        payload, response_headers = self.encode_infer(response, infer_request, headers)
        if trace is not None:
            trace.stamp("INFER_RESPONSE_COMPLETE")
        return payload, response_headers

    def prepare_infer(self, headers: dict[str, str], body: bytes, name: str, version: int | None,
                      config: ModelConfig | None = None) -> InferenceRequest:
        """The request a read and decoded ``/infer`` body asks for (``config``: the model's, for a raw-binary body)."""
        if config is not None:
            infer_request = parse_raw_binary(body, config, name, version)
        else:
            header, binary = split_body(body, headers.get(HEADER_LENGTH))
            infer_request = parse_request(header, binary, name, version)
        if self.header_forwarder is not None:
            infer_request.parameters.update(self.header_forwarder.matching(headers.items()))
        return infer_request

    @staticmethod
    def encode_infer(response: InferenceResponse, request: InferenceRequest,
                     headers: dict[str, str]) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The body and headers (all but Content-Length) of a successful ``/infer`` answer."""
        payload, json_length = encode_response(response, request, request.model_name)
        response_headers = []
        if json_length is not None:
            response_headers.append((b"inference-header-content-length", str(json_length).encode()))
            response_headers.append((b"content-type", b"application/octet-stream"))
        else:
            response_headers.append((b"content-type", b"application/json"))
        accepted = headers.get("accept-encoding")
        if accepted:
            payload = _compress(accepted, payload, response_headers)
        return payload, response_headers

    async def _read_body(self, headers: dict[str, str], receive: Receive) -> bytes:
        """The body as sent (not decompressed), within ``--http-max-input-size``."""
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_input_size:
            raise self.too_large(int(declared))
        message = await receive()
        body = message.get("body", b"")
        if message.get("more_body", False):
            chunks = [body]
            size = len(body)
            while message.get("more_body", False):
                message = await receive()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_input_size:
                    raise self.too_large(size)
                chunks.append(chunk)
            body = b"".join(chunks)
        return body

    # ---- model repository -------------------------------------------------------------------

    async def _json_body(self, request: Request) -> dict[str, Any]:
        body = await self._body(request)
        if not body.strip():
            return {}
        doc = request_json.parse(body)
        if not isinstance(doc, dict):
            raise ServerError("request body must be a JSON object")
        return doc

    async def repository_index(self, request: Request) -> Response:
        doc = await self._json_body(request)
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise ServerError("'ready' must be a boolean")
        return JSONResponse(await self.dataplane.repository_index(ready, request.path_params.get("repository", "")))

    async def _parameters(self, request: Request) -> dict[str, Any]:
        parameters = (await self._json_body(request)).get("parameters") or {}
        if not isinstance(parameters, dict):
            raise ServerError("'parameters' must be a JSON object")
        return parameters

    async def load(self, request: Request) -> Response:
        parameters = decode_file_parameters(await self._parameters(request))
        await self.dataplane.load_model(request.path_params["model"], parameters,
                                        request.path_params.get("repository", ""))
        return Response(status_code=200)

    async def unload(self, request: Request) -> Response:
        unload_dependents = (await self._parameters(request)).get("unload_dependents", False)
        if not isinstance(unload_dependents, bool):
            raise ServerError("Unable to parse 'unload_dependents': attempt to access JSON non-boolean as boolean")
        await self.dataplane.unload_model(request.path_params["model"], unload_dependents,
                                          request.path_params.get("repository", ""))
        return Response(status_code=200)


def _compress(accept_encoding: str, payload: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """Compress with the first of gzip or deflate the client accepts (Accept-Encoding order)."""
    for encoding in accept_encoding.split(","):
        encoding = encoding.split(";")[0].strip().lower()
        if encoding == "gzip":
            headers.append((b"content-encoding", b"gzip"))
            return gzip.compress(payload, compresslevel=6)
        if encoding == "deflate":
            headers.append((b"content-encoding", b"deflate"))
            return zlib.compress(payload)
    return payload


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], payload: bytes) -> None:
    headers.append((b"content-length", str(len(payload)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def error_body(message: str) -> bytes:
    """Triton's JSON error body."""
    return json.dumps({"error": message}).encode()


def _json_reply(status: int, doc: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return status, [(b"content-type", b"application/json")], json.dumps(doc).encode()


async def _send_json(send: Send, status: int, doc: dict[str, Any]) -> None:
    await _send(send, *_json_reply(status, doc))
