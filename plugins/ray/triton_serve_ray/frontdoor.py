"""The front door: triton-serve's own HTTP and gRPC front-ends, routing each request straight to a model replica."""
from __future__ import annotations

from typing import Any

from ray import serve

from triton_serve.plugin import FrontendOptions, Frontends, use_content_types

from .registry import registry_of
from .routing import ChannelDataPlane


class FrontDoor:
    """Accepts the clients' HTTP and gRPC connections on the ports of ``frontend`` (``FrontendOptions``
    fields) with the front-ends triton-serve itself runs, over a ``ChannelDataPlane``: each request goes over
    the channel to a live replica of its model. Ray Serve constructs it with the model deployments' handles
    (their names are the models it routes to; Ray deploys them with it) and the application's content types."""

    async def __init__(self, models: dict[str, Any], server_id: str,  # type: ignore[misc]  # Ray Serve awaits it
                       frontend: dict[str, Any], content_types: dict[str, str]) -> None:
        use_content_types(content_types)  # the application's, which requests and responses cross the channel in
        registry = registry_of(serve.get_replica_context().app_name)

        async def table() -> dict[str, list[str]]:
            return await registry.replicas.remote()
        self.dataplane = ChannelDataPlane(list(models), server_id, table)
        await self.dataplane.start()
        self.frontends = Frontends(self.dataplane, FrontendOptions(**frontend))
        await self.frontends.start()

    async def check_health(self) -> None:
        """Ray Serve's health check: the front-ends still serve."""

    async def __del__(self) -> None:
        """Ray Serve calls this when it stops the front door: finish the requests in flight, then stop."""
        frontends = getattr(self, "frontends", None)
        if frontends is not None:
            self.dataplane.accepting = False
            frontends.request_stop()
            await frontends.wait_stopped()
            self.dataplane.stop()
