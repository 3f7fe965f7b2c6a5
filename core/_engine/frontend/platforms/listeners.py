"""Binds the SageMaker and Vertex AI listeners that are on, each serving through a KServe v2 app of its own."""
from __future__ import annotations

import socket
from dataclasses import dataclass

from ..http.app import DEFAULT_MAX_INPUT_SIZE, HttpFrontend
from ..http.serving import listen_socket
from ...seam import DataPlaneAPI
from ..restricted import Restrictions, RestrictionCheck, kserve_category, sagemaker_category, vertex_ai_category
from .forwarding import ASGIApp
from .sagemaker import UNSPECIFIED_MODEL, SageMakerSettings, sagemaker_app
from .vertex_ai import VertexAiSettings, resolve_default_model, vertex_ai_app

PLATFORM_ADDRESS = "0.0.0.0"  # Triton's sagemaker_address_ and vertex_ai_address_ (no flag sets them)


@dataclass
class PlatformOptions:
    """The platform listeners' settings as plain values (a front-end process receives them as JSON); a port
    of None leaves that listener off."""

    sagemaker_port: int | None = None
    sagemaker_default_model: str = UNSPECIFIED_MODEL
    sagemaker_ping_mode: str = "ready"
    sagemaker_inference_type: str = "infer"  # SAGEMAKER_TRITON_INFERENCE_TYPE
    vertex_ai_port: int | None = None
    vertex_ai_predict_route: str = ""
    vertex_ai_health_route: str = ""
    vertex_ai_default_model: str = ""

    @property
    def any_on(self) -> bool:
        return self.sagemaker_port is not None or self.vertex_ai_port is not None


async def bind_platform_listeners(api: DataPlaneAPI, options: PlatformOptions, *, reuse_port: bool = False,
                                  max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
                                  restrictions: Restrictions | None = None) -> list[tuple[ASGIApp, socket.socket]]:
    """Each listener that is on, as its app and bound socket. The Vertex AI default model is resolved here
    (the models are loaded by now), so a wrong one fails the start with Triton's message. As in Triton,
    ``restrictions`` (``--http-restricted-api``) apply to each listener's own routes and to the KServe v2 app
    behind them, which forwards no header to models."""
    if not options.any_on:
        return []
    check = RestrictionCheck(restrictions or {})
    triton = check.guard(HttpFrontend(api, max_input_size).app(), kserve_category)
    apps: list[tuple[ASGIApp, int, str]] = []
    if options.vertex_ai_port is not None:
        vertex = VertexAiSettings(options.vertex_ai_predict_route, options.vertex_ai_health_route,
                                  options.vertex_ai_default_model)
        default_model = await resolve_default_model(api, vertex)
        apps.append((check.guard(vertex_ai_app(api, triton, vertex, default_model),
                                 vertex_ai_category(vertex.health_route)), options.vertex_ai_port, "Vertex AI"))
    if options.sagemaker_port is not None:
        sagemaker = SageMakerSettings(options.sagemaker_default_model, options.sagemaker_ping_mode,
                                      options.sagemaker_inference_type)
        apps.append((check.guard(sagemaker_app(api, triton, sagemaker), sagemaker_category), options.sagemaker_port,
                     "SageMaker"))
    bound: list[tuple[ASGIApp, socket.socket]] = []
    try:
        for app, port, what in apps:
            bound.append((app, listen_socket(PLATFORM_ADDRESS, port, reuse_port=reuse_port, what=what)))
    except BaseException:
        for _app, sock in bound:
            sock.close()
        raise
    return bound
