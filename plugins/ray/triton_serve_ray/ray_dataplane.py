"""The ingress's data plane: the methods triton-serve's HTTP front-end calls, answered by each model's deployment."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

import triton_serve
from triton_serve.plugin import InferenceRequest, ModelConfig, ServerError, Status

from .wire import Reply, WireRequest

log = logging.getLogger("triton_serve_ray")

# What works through the ingress: no shared memory (the client and the replicas need not share a host).
EXTENSIONS = ["classification", "model_repository", "model_configuration", "binary_tensor_data", "parameters",
              "statistics"]
# Triton's answer to load / unload when models are not under explicit control: a deployment's models are fixed.
CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"
SHARED_MEMORY = ("shared memory is not supported through Ray Serve: the client and the model replicas need not "
                 "share a host")
# A call that finds its replica dead (killed, or its node lost) goes to another replica, this many times in all.
ATTEMPTS = 3
HEALTH_TIMEOUT_S = 10.0  # a readiness probe gives up on a deployment that has no replica to answer


class RayDataPlane:
    """Offers the methods of triton-serve's ``DataPlane`` that the HTTP front-end calls; each model's
    calls go to that model's deployment handle, whose replicas run the core's own data plane.

    Called on the ingress replica's event loop. A call whose replica died before answering is sent
    again, and Ray routes it to a live replica (a stateful model's state died with its replica anyway).
    """

    def __init__(self, models: dict[str, DeploymentHandle], server_id: str) -> None:
        self.models = models
        self.server_id = server_id
        self.trace_armed = False  # the HTTP front-end notes trace timestamps only while True; no tracing here
        self._running: set[asyncio.Task[None]] = set()  # inference calls in flight

    def _handle(self, name: str) -> DeploymentHandle:
        handle = self.models.get(name)
        if handle is None:
            raise ServerError(f"Request for unknown model: '{name}' is not found", Status.NOT_FOUND)
        return handle

    async def _call(self, name: str, method: str, *args: Any) -> Any:
        """Call ``method`` on a replica of model ``name``; its value, or its ServerError raised here."""
        call: Callable[..., Any] = getattr(self._handle(name), method).remote
        died: RayActorError | None = None
        for _ in range(ATTEMPTS):
            try:
                reply: Reply = await call(*args)
            except RayActorError as error:
                died = error
                log.warning("model '%s': a replica died during %s; sending it again: %s", name, method, error)
                continue
            return reply.unwrap()
        raise ServerError(f"model '{name}': no replica could answer ({ATTEMPTS} tried): {died}", Status.UNAVAILABLE)

    # ---- health and metadata ----------------------------------------------------------------

    async def live(self) -> bool:
        return True

    async def server_ready(self) -> bool:
        """Every model's deployment has a replica that reports the model ready."""
        try:
            ready = await asyncio.wait_for(asyncio.gather(*(self.model_ready(name) for name in self.models)),
                                           HEALTH_TIMEOUT_S)
        except (TimeoutError, ServerError):
            return False
        return all(ready)

    async def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_id, "version": triton_serve.__version__, "extensions": list(EXTENSIONS)}

    async def model_ready(self, name: str, version: int | None = None) -> bool:
        if name not in self.models:
            return False
        return bool(await self._call(name, "model_ready", version))

    async def model_metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        return await self._call(name, "model_metadata", version)

    async def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        return await self._call(name, "model_config", version)

    async def model_config_json(self, name: str, version: int | None = None) -> dict[str, Any]:
        return await self._call(name, "model_config_json", version)

    async def model_statistics(self, name: str = "", version: int | None = None) -> list[dict[str, Any]]:
        """The answering replica's statistics of the model (of every model when ``name`` is empty)."""
        if name:
            return await self._call(name, "model_statistics", version)
        if version is not None:
            raise ServerError("statistics for a model version need the model name")
        per_model = await asyncio.gather(*(self._call(model, "model_statistics", None)
                                           for model in sorted(self.models)))
        return [entry for entries in per_model for entry in entries]

    # ---- inference --------------------------------------------------------------------------

    def submit(self, request: InferenceRequest, *, decoupled_error: str | None = None) -> None:
        """Start ``request`` on a replica of its model; its one response (or error) reaches the request's
        consumer. Ray serves unary inference only: a decoupled model is refused as the front-end asks."""
        self._handle(request.model_name)  # an unknown model fails at once, as in the server
        task = asyncio.get_running_loop().create_task(self._infer(request, decoupled_error or ""))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _infer(self, request: InferenceRequest, decoupled_error: str) -> None:
        try:
            wire = await self._call(request.model_name, "infer", WireRequest.of(request), decoupled_error)
        except ServerError as error:
            request.fail(error)
            return
        request.model_version = wire.model_version
        request.send(wire.to_response())

    # ---- repository -------------------------------------------------------------------------

    async def repository_index(self, ready_only: bool = False, repository: str = "") -> list[dict[str, str]]:
        per_model = await asyncio.gather(*(self._call(model, "repository_index", ready_only, repository)
                                           for model in sorted(self.models)))
        return [entry for entries in per_model for entry in entries]

    async def load_model(self, name: str, parameters: dict[str, Any], repository: str = "") -> None:
        raise ServerError(CONTROL_DISABLED, Status.UNAVAILABLE)

    async def unload_model(self, name: str, unload_dependents: bool = False, repository: str = "") -> None:
        raise ServerError(CONTROL_DISABLED, Status.UNAVAILABLE)

    # ---- not served through Ray -------------------------------------------------------------

    async def register_system_shared_memory(self, name: str, key: str, offset: int, byte_size: int) -> None:
        raise ServerError(SHARED_MEMORY, Status.UNSUPPORTED)

    async def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        raise ServerError(SHARED_MEMORY, Status.UNSUPPORTED)

    async def shared_memory_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        raise ServerError(SHARED_MEMORY, Status.UNSUPPORTED)

    async def unregister_shared_memory(self, kind: str, name: str = "") -> None:
        raise ServerError(SHARED_MEMORY, Status.UNSUPPORTED)

    async def log_settings(self) -> dict[str, Any]:
        raise ServerError(not_served("the logging extension"), Status.UNSUPPORTED)

    async def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        raise ServerError(not_served("the logging extension"), Status.UNSUPPORTED)

    async def trace_setting(self, model_name: str = "", update: Any = None) -> dict[str, list[str]]:
        raise ServerError(not_served("the trace extension"), Status.UNSUPPORTED)


def not_served(what: str) -> str:
    return f"{what} is not supported through Ray Serve: each model replica is a server of its own"
