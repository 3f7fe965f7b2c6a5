"""The ingress's data plane: the data-plane seam forwarded to the model deployments, whose replicas answer it."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

import triton_serve
from triton_serve.plugin import ForwardingDataPlane, InferenceRequest, ServerError, Status

from .wire import Reply, WireRequest

log = logging.getLogger("triton_serve_ray")

# What works through the ingress: no shared memory (the client and the replicas need not share a host).
EXTENSIONS = ["classification", "model_repository", "model_configuration", "binary_tensor_data", "parameters",
              "statistics"]
# Triton's answer to load / unload when models are not under explicit control: a deployment's models are fixed.
CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"
SHARED_MEMORY = ("shared memory is not supported through Ray Serve: the client and the model replicas need not "
                 "share a host")


def not_served(what: str) -> str:
    return f"{what} is not supported through Ray Serve: each model replica is a server of its own"


# The seam's calls that are not forwarded, and the error each answers instead: one replica cannot act for the
# deployment (load a model, register a region on its host, change its logging or tracing).
REFUSED: dict[str, tuple[str, Status]] = {
    "load_model": (CONTROL_DISABLED, Status.UNAVAILABLE),
    "unload_model": (CONTROL_DISABLED, Status.UNAVAILABLE),
    "register_system_shared_memory": (SHARED_MEMORY, Status.UNSUPPORTED),
    "register_cuda_shared_memory": (SHARED_MEMORY, Status.UNSUPPORTED),
    "shared_memory_status": (SHARED_MEMORY, Status.UNSUPPORTED),
    "unregister_shared_memory": (SHARED_MEMORY, Status.UNSUPPORTED),
    "log_settings": (not_served("the logging extension"), Status.UNSUPPORTED),
    "update_log_settings": (not_served("the logging extension"), Status.UNSUPPORTED),
    "trace_setting": (not_served("the trace extension"), Status.UNSUPPORTED),
}
# A call that finds its replica dead (killed, or its node lost) goes to another replica, this many times in all.
ATTEMPTS = 3
HEALTH_TIMEOUT_S = 10.0  # a readiness probe gives up on a deployment that has no replica to answer


class RayDataPlane(ForwardingDataPlane):
    """The seam the ingress's HTTP front-end calls. Every call is forwarded (``forward``: one call frame,
    ``ModelReplica.call``) except those ``REFUSED`` and those answered here (liveness, readiness, server
    metadata, and the readiness of a model that has no deployment): a call whose ``name`` names a model
    goes to that model's deployment, a call that names none to every deployment, their answers joined.

    Called on the ingress replica's event loop. A call whose replica died before answering is sent
    again, and Ray routes it to a live replica (a stateful model's state died with its replica anyway).
    """

    def __init__(self, models: dict[str, DeploymentHandle], server_id: str) -> None:
        self.models = models
        self.server_id = server_id
        self.trace_armed = False  # the HTTP front-end notes trace timestamps only while True; no tracing here
        self.accepting = True  # Ray Serve drains the ingress itself
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

    async def forward(self, method: str, arguments: dict[str, Any]) -> Any:
        """Refuse the call, or send it to the deployment of the model it names, or to every deployment."""
        refused = REFUSED.get(method)
        if refused is not None:
            raise ServerError(*refused)
        args = tuple(arguments.values())
        if arguments.get("name"):
            return await self._call(arguments["name"], "call", method, args)
        models = sorted(self.models)
        answers = await asyncio.gather(*(self._call(model, "call", method, args) for model in models))
        return joined(method, dict(zip(models, answers)))

    # ---- answered here ----------------------------------------------------------------------

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
        """False for a model without a deployment (the server's answer for an unknown model); else its replica's."""
        return name in self.models and bool(await self.forward("model_ready", {"name": name, "version": version}))

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


def joined(method: str, answers: dict[str, Any]) -> Any:
    """One answer from every deployment's answer to a call that names no model. Each replica answers for its
    whole server, whose repository holds the other models too (and an ensemble's replica loads its steps):
    of a list of entries (the index, statistics), each deployment's own model's entries are kept. Any other
    answer must be the same from every deployment."""
    values = list(answers.values())
    if all(isinstance(value, list) for value in values):
        return [entry for model, value in answers.items() for entry in value if entry.get("name") == model]
    if any(value != values[0] for value in values):
        raise ServerError(f"the model deployments answered '{method}' differently", Status.INTERNAL)
    return values[0] if values else None
