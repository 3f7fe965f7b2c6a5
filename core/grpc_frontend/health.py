"""The standard grpc.health.v1 Health service: SERVING while the server is ready, as Triton answers."""
from __future__ import annotations

from typing import Any

import grpc

from ..dataplane import DataPlane
from ..protos.health_pb2 import HealthCheckRequest, HealthCheckResponse
from ..protos.health_pb2_grpc import HealthServicer


class HealthCheckServicer(HealthServicer):
    """``Check`` ignores the service name, as Triton does; ``Watch`` is not offered."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane

    async def Check(self, request: HealthCheckRequest, context: Any) -> HealthCheckResponse:
        ready = await self.dataplane.server_ready()
        return HealthCheckResponse(status=HealthCheckResponse.SERVING if ready else HealthCheckResponse.NOT_SERVING)

    async def Watch(self, request: HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "grpc.health.v1.Health/Watch is not supported; use Check")
