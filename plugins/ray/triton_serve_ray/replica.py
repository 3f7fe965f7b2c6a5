"""One replica of a model's deployment: the triton-serve core, loading that one model, without front-ends."""
from __future__ import annotations

from typing import Any

from triton_serve.plugin import Server, ServerError, ServerOptions, call_by_name, infer_one

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

    async def call(self, method: str, args: tuple[Any, ...]) -> Reply:
        """Answer one call of the data-plane seam that the ingress forwarded (``RayDataPlane.forward``) with
        this replica's data plane, which serves every model of its server (this one, an ensemble's steps)."""
        try:
            return Reply(await call_by_name(self.dataplane, method, args))
        except ServerError as error:
            return Reply.failed(error)

    async def check_health(self) -> None:
        """Ray Serve's health check: raising makes Ray replace this replica."""
        if not await self.dataplane.model_ready(self.model):
            raise RuntimeError(f"model '{self.model}' is not ready in this replica")

    async def __del__(self) -> None:
        """Ray Serve calls this when it stops the replica: unload the model, stop its backend processes."""
        server = getattr(self, "server", None)
        if server is not None:
            await server.stop()
