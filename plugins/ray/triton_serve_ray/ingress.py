"""The KServe v2 HTTP ingress: triton-serve's own HTTP front-end, over a data plane that calls the model deployments."""
from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from triton_serve.plugin import http_asgi_app

from .ray_dataplane import RayDataPlane

AsgiApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


@serve.ingress()
class KServeIngress:
    """Speaks the protocol triton-serve's HTTP front-end speaks (same routes, JSON and binary tensors,
    errors, compression), so ``tritonclient.http`` and ``perf_analyzer -i http`` work unchanged.

    Ray Serve constructs it with a handle per model deployment, then calls
    ``__serve_build_asgi_app__`` once on the replica and sends it every HTTP request under the
    application's route prefix.
    """

    def __init__(self, models: dict[str, DeploymentHandle], server_id: str, max_input_size: int) -> None:
        self.dataplane = RayDataPlane(models, server_id)
        self.max_input_size = max_input_size

    def __serve_build_asgi_app__(self) -> AsgiApp:
        return http_asgi_app(self.dataplane, self.max_input_size)
