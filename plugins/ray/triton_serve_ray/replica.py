"""One replica of a model's deployment: the triton-serve core, loading that one model, without front-ends."""
from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from triton_serve.plugin import Server, ServerError, ServerOptions, infer_one

from .wire import Reply, WireRequest, WireResponse


class ModelReplica:
    """Serves one model the way triton-serve does: the same repository, backends and data plane.

    Ray Serve constructs it (``__init__`` loads the model; a load failure fails the replica, with the
    reason), calls its methods from the ingress through a deployment handle, and calls
    ``check_health`` periodically. Every method runs on the replica's event loop. Each returns a
    ``Reply``, so a ServerError reaches the ingress with its Triton status.
    """

    async def __init__(self, model_repository: list[str], model: str,  # type: ignore[misc]  # Ray Serve awaits it
                       backend_config: dict[str, dict[str, str]]) -> None:
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
        self.dataplane = server.dataplane

    async def infer(self, wire: WireRequest, decoupled_error: str) -> Reply:
        """Run one request through the data plane; the reply holds a WireResponse."""
        request = wire.to_request()
        try:
            response = await infer_one(self.dataplane, request, decoupled_error)
        except ServerError as error:
            return Reply.failed(error)
        return Reply(WireResponse.of(response, request.model_version))

    async def model_ready(self, version: int | None) -> Reply:
        return await _reply(self.dataplane.model_ready(self.model, version))

    async def model_metadata(self, version: int | None) -> Reply:
        return await _reply(self.dataplane.model_metadata(self.model, version))

    async def model_config(self, version: int | None) -> Reply:
        return await _reply(self.dataplane.model_config(self.model, version))

    async def model_config_json(self, version: int | None) -> Reply:
        return await _reply(self.dataplane.model_config_json(self.model, version))

    async def model_statistics(self, version: int | None) -> Reply:
        """This replica's statistics of the model (each replica counts only what it served)."""
        return await _reply(self.dataplane.model_statistics(self.model, version))

    async def repository_index(self, ready_only: bool, repository: str) -> Reply:
        """The repository index entries of this replica's model (in the repository named so, if named)."""
        reply = await _reply(self.dataplane.repository_index(ready_only, repository))
        if reply.error is None:
            reply.value = [entry for entry in reply.value if entry["name"] == self.model]
        return reply

    async def check_health(self) -> None:
        """Ray Serve's health check: raising makes Ray replace this replica."""
        if not await self.dataplane.model_ready(self.model):
            raise RuntimeError(f"model '{self.model}' is not ready in this replica")

    async def __del__(self) -> None:
        """Ray Serve calls this when it stops the replica: unload the model, stop its backend processes."""
        server = getattr(self, "server", None)
        if server is not None:
            await server.stop()


async def _reply(call: Awaitable[Any]) -> Reply:
    try:
        return Reply(await call)
    except ServerError as error:
        return Reply.failed(error)
