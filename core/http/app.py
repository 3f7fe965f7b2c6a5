"""Starlette routes for the HTTP front-end; each handler translates JSON and calls the data plane."""
from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..dataplane import DataPlane
from ..errors import ServerError, Status
from .codec import encode_response, parse_raw_binary, parse_request, split_body

HEADER_LENGTH = "inference-header-content-length"
DECOUPLED_ERROR = "HTTP end point doesn't support models with decoupled transaction policy"
DEFAULT_MAX_INPUT_SIZE = 1 << 26


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _version(request: Request) -> int | None:
    raw = request.path_params.get("version")
    return int(raw) if raw is not None else None


class HttpFrontend:
    """Builds the ASGI app; ``max_input_size`` bounds request bodies (``--http-max-input-size``)."""

    def __init__(self, dataplane: DataPlane, max_input_size: int = DEFAULT_MAX_INPUT_SIZE) -> None:
        self.dataplane = dataplane
        self.max_input_size = max_input_size

    def app(self) -> Starlette:
        model = "/v2/models/{model}"
        versioned = "/v2/models/{model}/versions/{version:int}"
        routes = [
            Route("/v2/health/live", self.live, methods=["GET"]),
            Route("/v2/health/ready", self.ready, methods=["GET"]),
            Route("/v2", self.server_metadata, methods=["GET"]),
            Route("/v2/models/stats", self.model_statistics, methods=["GET"]),
            Route("/v2/repository/index", self.repository_index, methods=["POST"]),
            Route("/v2/repository/models/{model}/load", self.load, methods=["POST"]),
            Route("/v2/repository/models/{model}/unload", self.unload, methods=["POST"]),
            Route("/v2/repository/{repository}/index", self.named_repository, methods=["POST"]),
            Route("/v2/repository/{repository}/models/{model}/{action:str}", self.named_repository,
                  methods=["POST"]),
        ]
        for prefix in (model, versioned):
            routes += [
                Route(prefix, self.model_metadata, methods=["GET"]),
                Route(prefix + "/ready", self.model_ready, methods=["GET"]),
                Route(prefix + "/config", self.model_config, methods=["GET"]),
                Route(prefix + "/stats", self.model_statistics, methods=["GET"]),
                Route(prefix + "/infer", self.infer, methods=["POST"]),
            ]
        return Starlette(routes=routes, exception_handlers={
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
        return Response(status_code=200 if self.dataplane.live else 400)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.dataplane.server_ready() else 400)

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse(self.dataplane.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        return JSONResponse(self.dataplane.model_metadata(request.path_params["model"], _version(request)))

    async def model_ready(self, request: Request) -> Response:
        if self.dataplane.model_ready(request.path_params["model"], _version(request)):
            return Response(status_code=200)
        return _error("Model version not ready", 400)

    async def model_config(self, request: Request) -> Response:
        return JSONResponse(self.dataplane.model_config_json(request.path_params["model"], _version(request)))

    async def model_statistics(self, request: Request) -> Response:
        stats = self.dataplane.model_statistics(request.path_params.get("model", ""), _version(request))
        return JSONResponse({"model_stats": stats})

    # ---- inference --------------------------------------------------------------------------

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_input_size:
            raise self._too_large(int(declared))
        body = await request.body()
        if len(body) > self.max_input_size:
            raise self._too_large(len(body))
        encoding = request.headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "deflate"):
            decompressor = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
            try:
                body = decompressor.decompress(body, self.max_input_size + 1)
            except zlib.error as error:
                raise ServerError(f"failed to decompress the {encoding} request body: {error}") from None
            if len(body) > self.max_input_size or decompressor.unconsumed_tail:
                raise self._too_large(len(body))
        elif encoding not in ("", "identity"):
            raise ServerError(f"unsupported Content-Encoding '{encoding}'; use gzip or deflate",
                              Status.UNSUPPORTED)
        return body

    def _too_large(self, size: int) -> ServerError:
        return ServerError(f"request body of {size} bytes exceeds the maximum input size of "
                           f"{self.max_input_size} bytes (--http-max-input-size)")

    async def infer(self, request: Request) -> Response:
        name, version = request.path_params["model"], _version(request)
        body = await self._body(request)
        header_length = request.headers.get(HEADER_LENGTH)
        if header_length is not None and header_length.strip() == "0":
            infer_request = parse_raw_binary(body, self.dataplane.model_config(name, version), name, version)
        else:
            header, binary = split_body(body, header_length)
            infer_request = parse_request(header, binary, name, version)
        response = await self.dataplane.infer(infer_request, DECOUPLED_ERROR)
        payload, json_length = encode_response(response, infer_request, name)
        headers = {}
        if json_length is not None:
            headers["Inference-Header-Content-Length"] = str(json_length)
            media_type = "application/octet-stream"
        else:
            media_type = "application/json"
        payload = self._compress(request, payload, headers)
        return Response(payload, media_type=media_type, headers=headers)

    @staticmethod
    def _compress(request: Request, payload: bytes, headers: dict[str, str]) -> bytes:
        accepted = [e.split(";")[0].strip().lower() for e in request.headers.get("accept-encoding", "").split(",")]
        for encoding in accepted:
            if encoding == "gzip":
                headers["Content-Encoding"] = "gzip"
                return gzip.compress(payload, compresslevel=6)
            if encoding == "deflate":
                headers["Content-Encoding"] = "deflate"
                return zlib.compress(payload)
        return payload

    # ---- model repository -------------------------------------------------------------------

    async def _json_body(self, request: Request) -> dict[str, Any]:
        body = await self._body(request)
        if not body.strip():
            return {}
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ServerError(f"failed to parse the request JSON buffer: {error}") from None
        if not isinstance(doc, dict):
            raise ServerError("request body must be a JSON object")
        return doc

    async def repository_index(self, request: Request) -> Response:
        doc = await self._json_body(request)
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise ServerError("'ready' must be a boolean")
        return JSONResponse(self.dataplane.repository_index(ready))

    async def load(self, request: Request) -> Response:
        doc = await self._json_body(request)
        parameters = doc.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise ServerError("'parameters' must be a JSON object")
        await self.dataplane.load_model(request.path_params["model"], parameters)
        return Response(status_code=200)

    async def unload(self, request: Request) -> Response:
        await self._json_body(request)
        await self.dataplane.unload_model(request.path_params["model"])
        return Response(status_code=200)

    async def named_repository(self, request: Request) -> Response:
        raise ServerError("'repository_name' specification is not supported", Status.UNSUPPORTED)
