"""HTTP routes of Triton's system and CUDA shared-memory extensions: status, register, unregister."""
from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import ServerError, Status
from ...seam import DataPlaneAPI

JsonBody = Callable[[Request], Awaitable[dict[str, Any]]]
_PATHS = {"system": "/v2/systemsharedmemory", "cuda": "/v2/cudasharedmemory"}


class SharedMemoryRoutes:
    """``/v2/{system,cuda}sharedmemory[/region/{region}]/{status,register,unregister}``, translated to
    the data plane's shared-memory calls (``json_body`` reads a request body as a JSON object)."""

    def __init__(self, dataplane: DataPlaneAPI, json_body: JsonBody) -> None:
        self.dataplane = dataplane
        self.json_body = json_body

    def routes(self) -> list[Route]:
        routes = []
        for kind, path in _PATHS.items():
            for prefix in (path, path + "/region/{region}"):
                routes += [
                    Route(prefix + "/status", functools.partial(self.status, kind), methods=["GET"]),
                    Route(prefix + "/register", functools.partial(self.register, kind), methods=["POST"]),
                    Route(prefix + "/unregister", functools.partial(self.unregister, kind), methods=["POST"]),
                ]
        return routes

    async def status(self, kind: str, request: Request) -> Response:
        return JSONResponse(await self.dataplane.shared_memory_status(kind, request.path_params.get("region", "")))

    async def unregister(self, kind: str, request: Request) -> Response:
        await self.dataplane.unregister_shared_memory(kind, request.path_params.get("region", ""))
        return Response(status_code=200)

    async def register(self, kind: str, request: Request) -> Response:
        name = request.path_params.get("region", "")
        if not name:
            raise ServerError(f"'region name' is necessary to register {kind} shared memory region")
        doc = await self.json_body(request)
        if kind == "system":
            key = _required(doc, "key")
            if not isinstance(key, str):
                raise ServerError(f"Unable to parse 'key' of shared memory region '{name}': attempt to access JSON "
                                  "non-string as string", Status.INTERNAL)
            offset = _unsigned(doc, "offset", name) if "offset" in doc else 0
            _required(doc, "byte_size")
            await self.dataplane.register_system_shared_memory(name, key, offset, _unsigned(doc, "byte_size", name))
        else:
            handle = _required(doc, "raw_handle")
            encoded = handle.get("b64") if isinstance(handle, dict) else None
            try:
                raw = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else b""
            except binascii.Error:
                raw = b""
            if len(raw) != 64:
                raise ServerError("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
            await self.dataplane.register_cuda_shared_memory(name, raw, _unsigned(doc, "device_id", name),
                                                             _unsigned(doc, "byte_size", name))
        return Response(status_code=200)


def _required(doc: dict[str, Any], field: str) -> Any:
    if field not in doc:
        raise ServerError(f"Shared memory register request has no '{field}' field")
    return doc[field]


def _unsigned(doc: dict[str, Any], field: str, name: str) -> int:
    """An unsigned 64-bit JSON integer; otherwise Triton's message and status (INTERNAL), naming the region."""
    value = doc.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
        raise ServerError(f"Unable to parse '{field}' of shared memory region '{name}': attempt to access JSON "
                          "non-unsigned-integer as unsigned-integer", Status.INTERNAL)
    return value
