"""The SageMaker and Vertex AI flags and environment variables, and Triton's check that no two listeners share
a port (or that every port lies in ``--sagemaker-safe-port-range``)."""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from .errors import ServerError
from .frontend.platforms.listeners import PLATFORM_ADDRESS, PlatformOptions
from .frontend.platforms.sagemaker import SageMakerSettings
from .frontend.platforms.vertex_ai import DEFAULT_PORT, VertexAiSettings


def _port_range(text: str) -> tuple[int, int]:
    low, separator, high = text.partition("-")
    try:
        if separator:
            return int(low), int(high)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected <integer>-<integer>, got '{text}'")


def add_platform_flags(parser: argparse.ArgumentParser, sagemaker: argparse._ArgumentGroup,
                       vertex: argparse._ArgumentGroup, boolean: Callable[[str], bool]) -> None:
    """Triton's Sagemaker and Vertex flags. ``AIP_MODE=PREDICTION`` turns Vertex AI on and HTTP and gRPC off by
    default, and ``AIP_HTTP_PORT`` gives the Vertex AI port's default, as in Triton."""
    add = sagemaker.add_argument
    add("--allow-sagemaker", type=boolean, nargs="?", const=True, default=False,
        help="serve SageMaker's /ping, /invocations and /models routes (default false)")
    add("--sagemaker-port", type=int, default=8080, help="the SageMaker port (default 8080)")
    add("--sagemaker-safe-port-range", type=_port_range, default=None, metavar="<integer>-<integer>",
        help="every other listener's port must lie in this range")
    add = vertex.add_argument
    add("--allow-vertex-ai", type=boolean, nargs="?", const=True, default=None,
        help="serve AIP_PREDICT_ROUTE and AIP_HEALTH_ROUTE (default true where AIP_MODE=PREDICTION)")
    add("--vertex-ai-port", type=int, default=None, help="the Vertex AI port (default AIP_HTTP_PORT, else 8080)")
    add("--vertex-ai-default-model", default="",
        help="the model AIP_PREDICT_ROUTE infers (default: the repository's only model)")
    if os.environ.get("AIP_MODE", "") == "PREDICTION":
        parser.set_defaults(allow_http=False, allow_grpc=False)


def platform_options_from_args(args: argparse.Namespace) -> PlatformOptions:
    """The listeners the flags turn on, after Triton's port checks."""
    allow_vertex = args.allow_vertex_ai
    if allow_vertex is None:
        allow_vertex = os.environ.get("AIP_MODE", "") == "PREDICTION"
    vertex_port = args.vertex_ai_port
    if vertex_port is None:
        text = os.environ.get("AIP_HTTP_PORT", str(DEFAULT_PORT))
        try:
            vertex_port = int(text)
        except ValueError:
            raise ServerError(f"AIP_HTTP_PORT must be an integer, got '{text}'") from None
    options = PlatformOptions()
    if args.allow_sagemaker:
        settings = SageMakerSettings.from_environment()
        options.sagemaker_port = args.sagemaker_port
        options.sagemaker_default_model = settings.default_model
        options.sagemaker_ping_mode = settings.ping_mode
        options.sagemaker_inference_type = settings.inference_type
    if allow_vertex:
        vertex = VertexAiSettings.from_environment(args.vertex_ai_default_model)
        options.vertex_ai_port = vertex_port
        options.vertex_ai_predict_route = vertex.predict_route
        options.vertex_ai_health_route = vertex.health_route
        options.vertex_ai_default_model = vertex.default_model
    check_port_collisions(args, options)
    return options


def check_port_collisions(args: argparse.Namespace, platforms: PlatformOptions) -> None:
    """Triton's CheckPortCollision: two listeners on one address and port, or (with
    ``--sagemaker-safe-port-range``) a listener outside the range, stop the start with Triton's message."""
    # (name, address, port, safe range or None)
    listeners: list[tuple[str, str, int, Any]] = []
    if args.allow_http:
        listeners.append(("HTTP", args.http_address, args.http_port, None))
    if args.allow_grpc:
        listeners.append(("GRPC", args.grpc_address, args.grpc_port, None))
    if args.allow_metrics:
        listeners.append(("metrics", args.metrics_address, args.metrics_port, None))
    if platforms.sagemaker_port is not None:
        listeners.append(("SageMaker", PLATFORM_ADDRESS, platforms.sagemaker_port, args.sagemaker_safe_port_range))
    if platforms.vertex_ai_port is not None:
        listeners.append(("Vertex AI", PLATFORM_ADDRESS, platforms.vertex_ai_port, None))
    for index, (name, address, port, safe) in enumerate(listeners):
        others = listeners if safe is not None else listeners[index + 1:]
        for other in others:
            if other is listeners[index] or other[1] != address:
                continue
            if safe is not None and not safe[0] <= other[2] <= safe[1]:
                raise ServerError(f"The server cannot listen to {other[0]} requests at port {other[2]}, "
                                  f"allowed port range is [{safe[0]}, {safe[1]}]")
            if port == other[2] and port != 0:  # 0: each listener gets a free port of its own
                raise ServerError(f"The server cannot listen to {name} requests and {other[0]} requests at the "
                                  f"same address and port {address}:{port}")
