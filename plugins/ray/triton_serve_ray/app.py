"""Builds the Ray Serve application for a model repository: a deployment per model behind a front door that
routes each request straight to a model replica."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from ray import serve
from ray.serve import Application, Deployment
from ray.serve.handle import DeploymentHandle

from triton_serve.plugin import Server, ServerOptions, content_type_names

from .frontdoor import FrontDoor
from .options import AppArgs
from .replica import ModelReplica

INGRESS = "TritonFrontDoor"  # the front door deployment's name; the model deployments are named after their models


def list_models(locations: list[str]) -> list[str]:
    """Every model in the repositories, found the way triton-serve finds them (any repository source)."""
    dataplane = Server(ServerOptions(model_repositories=locations, model_control_mode="explicit",
                                     allow_http=False, allow_grpc=False, allow_metrics=False)).dataplane
    with ThreadPoolExecutor(1) as pool:  # the caller may be running an event loop already
        index = pool.submit(asyncio.run, dataplane.repository_index()).result()
    return sorted({entry["name"] for entry in index})


def build_app(args: dict[str, Any] | AppArgs) -> Application:
    """The application for ``serve run triton_serve_ray:build_app model_repository=/path [key=value ...]``
    (or a Serve config file's ``args``); ``args`` are ``AppArgs`` fields. Its replicas and front doors use the
    content types of this process (``InferenceRequest.content_type``, ``InferenceResponse.content_type``).
    Raises ValueError for a repository without models, or for a model that it does not hold."""
    options = args if isinstance(args, AppArgs) else AppArgs.model_validate(args)
    available = list_models(options.model_repository)
    unknown = options.unknown_models(available)
    if unknown:
        raise ValueError(f"no model {', '.join(map(repr, unknown))} in {', '.join(options.model_repository)} "
                         f"(models there: {', '.join(available) or 'none'})")
    names = options.models or available
    if not names:
        raise ValueError(f"no model in {', '.join(options.model_repository)}")
    if INGRESS in names:
        raise ValueError(f"a model may not be named '{INGRESS}': the front door deployment has that name")
    content_types = content_type_names()  # this process's: the replicas and front doors import them
    models = {name: _deployment(ModelReplica).options(name=name, **options.options_for(name))
              .bind(options.model_repository, name, options.backend_config, content_types) for name in names}
    front_door = _deployment(FrontDoor).options(name=INGRESS, **options.ingress_options)
    return front_door.bind(models, options.server_id, options.frontend_options(), content_types)


def _deployment(cls: type) -> Deployment:
    """``serve.deployment(cls)``: Ray annotates it as returning the decorator even when given the class."""
    return cast(Deployment, serve.deployment(cls))


def deploy(model_repository: str | list[str], *, name: str = "triton", **args: Any) -> DeploymentHandle:
    """Deploy the repository on the Ray cluster this process is connected to (Serve starts one if none, without
    Ray's HTTP proxy) as application ``name``, and wait until every replica is ready and the front door
    listens. ``args`` are the other ``AppArgs`` fields. Returns the front door's handle."""
    serve.start(proxy_location="Disabled")  # the front door is ours; no effect when Serve already runs
    return serve.run(build_app({"model_repository": model_repository, **args}), name=name, route_prefix=None)
