"""The standard grpc.health.v1 Health service: SERVING while the server is ready, as Triton answers."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ...seam import DataPlaneAPI
from ...protos.health_pb2 import HealthCheckRequest, HealthCheckResponse
from ...protos.health_pb2_grpc import HealthServicer

WATCH_INTERVAL_S = 0.5


class HealthCheckServicer(HealthServicer):
    """``Check`` and ``Watch`` ignore the service name, as Triton does."""

    def __init__(self, dataplane: DataPlaneAPI) -> None:
        self.dataplane = dataplane

    async def Check(self, request: HealthCheckRequest, context: Any) -> HealthCheckResponse:
        return HealthCheckResponse(status=await self._status())

    async def Watch(self, request: HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[HealthCheckResponse]:
        """The status now, then each change (readiness is looked at every WATCH_INTERVAL_S), until the
        client cancels or the server stops."""
        last = None
        while True:
            status = await self._status()
            if status != last:
                yield HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def _status(self) -> HealthCheckResponse.ServingStatus:
        ready = await self.dataplane.server_ready()
        return HealthCheckResponse.SERVING if ready else HealthCheckResponse.NOT_SERVING
