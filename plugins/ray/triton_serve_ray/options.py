"""The arguments of ``build_app``: where the models are and how Ray runs each model's deployment."""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from triton_serve.plugin import DEFAULT_MAX_INPUT_SIZE

from .autoscaling import POLICY

EVERY_MODEL = "*"  # the key in ``deployment_options`` whose options apply to every model


class AppArgs(BaseModel):
    """What ``serve run triton_serve_ray:build_app key=value ...`` (or a Serve config file) passes.

    On the command line every value is text: lists are comma-separated, mappings are JSON objects.
    ``deployment_options`` maps a model name (or ``"*"``: every model) to options of Ray's
    ``Deployment.options`` (``num_replicas``, ``autoscaling_config``, ``ray_actor_options``,
    ``max_ongoing_requests``...); a model's own entry wins, key by key, over ``"*"``.
    ``ingress_options`` are the same options for the front door's deployment (``TritonFrontDoor``).
    """

    model_config = ConfigDict(extra="forbid")

    model_repository: list[str] = Field(min_length=1)
    models: list[str] = Field(default_factory=list)  # empty: every model in the repositories
    deployment_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    ingress_options: dict[str, Any] = Field(default_factory=dict)
    backend_config: dict[str, dict[str, str]] = Field(default_factory=dict)  # as --backend-config
    server_id: str = "triton"  # the server metadata's "name" (tritonserver --id)
    http_max_input_size: int = Field(default=DEFAULT_MAX_INPUT_SIZE, gt=0)  # as --http-max-input-size
    host: str = "0.0.0.0"  # the front door's address, as --http-address and --grpc-address
    http_port: int = Field(default=8000, ge=0, le=65535)  # as --http-port
    grpc_port: int = Field(default=8001, ge=0, le=65535)  # as --grpc-port

    @field_validator("model_repository", "models", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("deployment_options", "ingress_options", "backend_config", mode="before")
    @classmethod
    def _parse_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"expected a JSON object, got {value!r} ({error})") from None
        return value

    def options_for(self, model: str) -> dict[str, Any]:
        """The Ray deployment options of ``model``'s deployment: ``"*"``'s, then its own. An autoscaled
        deployment scales on the requests its replicas hold (``autoscaling.POLICY``) unless a policy is given."""
        options = {**self.deployment_options.get(EVERY_MODEL, {}), **self.deployment_options.get(model, {})}
        if options.get("num_replicas") == "auto" or "autoscaling_config" in options:
            autoscaling = dict(options.get("autoscaling_config") or {})
            autoscaling.setdefault("policy", {"policy_function": POLICY})
            options["autoscaling_config"] = autoscaling
        return options

    def frontend_options(self) -> dict[str, Any]:
        """The front door's ``FrontendOptions`` fields."""
        return {"http_address": self.host, "http_port": self.http_port, "grpc_address": self.host,
                "grpc_port": self.grpc_port, "http_max_input_size": self.http_max_input_size}

    def unknown_models(self, available: list[str]) -> list[str]:
        """Names in ``models`` or ``deployment_options`` that no repository holds."""
        named = set(self.models) | (set(self.deployment_options) - {EVERY_MODEL})
        return sorted(named - set(available))
