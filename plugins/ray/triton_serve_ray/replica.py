"""One replica of a model's deployment: the triton-serve core, loading that one model, serving the channel on a
TCP port that the front doors reach it on."""
from __future__ import annotations

import asyncio
import logging
import time

import ray
from ray import serve

from triton_serve.plugin import Server, ServerOptions, serve_channel, use_content_types

from .autoscaling import ONGOING_REQUESTS
from .registry import HEARTBEAT_S, registry_of
from .routing import REFRESH_S

# After leaving the registry a replica keeps serving while the front doors still route to it (they read the
# registry every REFRESH_S), then for as long as requests it holds take to be answered, at most DRAIN_S (within
# Ray Serve's graceful shutdown timeout, 20 s by default).
LEAVE_GRACE_S = 3 * REFRESH_S
DRAIN_S = 10.0

log = logging.getLogger("triton_serve_ray")


class ModelReplica:
    """Serves one model the way triton-serve does: the same repository, backends and data plane, as the model
    owner of a channel listener (the one front-end processes use) on a free TCP port of its node.

    Ray Serve constructs it with the application's content types (``content_type_names`` where it was built;
    ``__init__`` imports them, then loads the model; a load failure fails the replica, with the reason) and
    calls ``check_health`` periodically. The replica reports its channel address to the application's registry
    while it lives; the front doors route requests to it from there.
    """

    async def __init__(self, model_repository: list[str], model: str,  # type: ignore[misc]  # Ray Serve awaits it
                       backend_config: dict[str, dict[str, str]], content_types: dict[str, str]) -> None:
        use_content_types(content_types)  # the deployment's, which requests and responses cross the channel in
        self.model = model
        server = Server(ServerOptions(
            model_repositories=model_repository, model_control_mode="explicit", load_models=[model],
            allow_http=False, allow_grpc=False, allow_metrics=False, backend_config=backend_config))
        await server.start()
        if not await server.dataplane.model_ready(model):
            reasons = [entry["reason"] for entry in await server.dataplane.repository_index()
                       if entry["name"] == model and entry.get("reason")]
            await server.stop()
            raise RuntimeError(f"model '{model}' failed to load: {'; '.join(reasons) or 'no reason given'}")
        self.server = server
        self.listener = await serve_channel(server.dataplane, "0.0.0.0", 0)
        self.address = f"{ray.util.get_node_ip_address()}:{self.listener.port}"
        self.registry = registry_of(serve.get_replica_context().app_name)
        self.heartbeat = asyncio.get_running_loop().create_task(self._report())

    async def _report(self) -> None:
        """Tell the registry this replica serves, every HEARTBEAT_S."""
        while True:
            try:
                await self.registry.heartbeat.remote(self.model, self.address)
            except Exception as error:  # the registry is being restarted; the next beat reaches its successor
                log.warning("replica %s of '%s': could not report to the registry: %s", self.address, self.model,
                            error)
                self.registry = registry_of(serve.get_replica_context().app_name)
            await asyncio.sleep(HEARTBEAT_S)

    def record_autoscaling_stats(self) -> dict[str, float]:
        """The load Ray's autoscaler weighs (``autoscaling.ongoing_requests_policy``): the requests this replica
        holds, which reach it over the channel, past Ray's own counters."""
        return {ONGOING_REQUESTS: float(self.listener.ongoing())}

    async def check_health(self) -> None:
        """Ray Serve's health check: raising makes Ray replace this replica."""
        if not await self.server.dataplane.model_ready(self.model):
            raise RuntimeError(f"model '{self.model}' is not ready in this replica")

    async def __del__(self) -> None:
        """Ray Serve calls this when it stops the replica (scaled down or replaced): leave the registry, answer
        what the front doors send until they have read that, then stop serving. Stopping at once answered the
        requests still on their way 'no available versions' while the model unloaded."""
        heartbeat = getattr(self, "heartbeat", None)
        if heartbeat is None:
            return
        heartbeat.cancel()
        await self.registry.leave.remote(self.model, self.address)
        await asyncio.sleep(LEAVE_GRACE_S)
        deadline = time.monotonic() + DRAIN_S
        while self.listener.ongoing() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.listener.close()
        await self.server.stop()
