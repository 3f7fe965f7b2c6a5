"""The data-plane seam: the one API every front-end calls, answered by ``DataPlane`` in the model owner and
forwarded, call by call, from front-end processes (``RemoteDataPlane``) and other hosts (triton-serve-ray)."""
from __future__ import annotations

import inspect
from typing import Any, Protocol

from .inference import InferenceRequest, InferenceResponse
from .protos.model_config_pb2 import ModelConfig
from .trace_settings import SettingUpdate


class DataPlaneAPI(Protocol):
    """What a front-end may ask of the server. Every coroutine method is a call a remote front-end forwards by
    name (``REMOTE_CALLS``); ``submit`` starts a request whose responses come back through the request."""

    # True while the front-ends should note trace timestamps for every request (a trace setting is on).
    trace_armed: bool
    # False once the server stops taking new requests (a graceful stop has begun).
    accepting: bool

    async def live(self) -> bool:
        """Whether the server is live."""

    async def server_ready(self) -> bool:
        """Whether the server is ready (every model ready, under strict readiness)."""

    async def server_metadata(self) -> dict[str, Any]:
        """Triton's server metadata: name, version, extensions."""

    async def model_ready(self, name: str, version: int | None = None) -> bool:
        """Whether the model (version) is ready."""

    async def model_metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        """Triton's model metadata: versions, platform, inputs, outputs."""

    async def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        """The model's configuration."""

    async def model_config_json(self, name: str, version: int | None = None) -> dict[str, Any]:
        """The model's configuration as Triton's JSON."""

    async def is_decoupled(self, name: str, version: int | None = None) -> bool:
        """Whether the model is decoupled (0..N responses per request)."""

    async def model_statistics(self, name: str = "", version: int | None = None) -> list[dict[str, Any]]:
        """Triton's statistics entries of one model, or of every model when ``name`` is empty."""

    async def repository_index(self, ready_only: bool = False, repository: str = "") -> list[dict[str, str]]:
        """The repository index: every model with its state."""

    async def load_model(self, name: str, parameters: dict[str, Any], repository: str = "") -> None:
        """Load or reload a model, with Triton's ``config`` and ``file:`` overrides in ``parameters``."""

    async def unload_model(self, name: str, unload_dependents: bool = False, repository: str = "") -> None:
        """Unload a model, and with ``unload_dependents`` the models using it."""

    async def register_system_shared_memory(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register a system shared-memory region."""

    async def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int,
                                          byte_size: int) -> None:
        """Register a CUDA shared-memory region from its IPC handle."""

    async def shared_memory_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        """Triton's status entries of the ``kind`` (system or cuda) regions."""

    async def unregister_shared_memory(self, kind: str, name: str = "") -> None:
        """Unregister one region, or every region of ``kind`` without a name."""

    async def log_settings(self) -> dict[str, Any]:
        """The log settings."""

    async def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Change the named log settings; the settings now."""

    async def trace_setting(self, model_name: str = "",
                            update: SettingUpdate | None = None) -> dict[str, list[str]]:
        """Apply ``update`` to the model's or the global trace settings; the settings now."""

    def submit(self, request: InferenceRequest, *, decoupled_error: str | None = None) -> None:
        """Start ``request``; its 0..N responses reach its sink (or ``request.responses()``). Raise ServerError
        when it cannot start. ``decoupled_error``: a unary front-end's refusal of decoupled models."""


# The seam's calls, by name: what a front-end process forwards to the model owner, and all the owner answers.
REMOTE_CALLS = frozenset(name for name, member in vars(DataPlaneAPI).items() if inspect.iscoroutinefunction(member))


async def infer_one(api: DataPlaneAPI, request: InferenceRequest, decoupled_error: str) -> InferenceResponse:
    """Submit a request that expects exactly one response (HTTP /infer, gRPC ModelInfer) and wait for it; an
    error response is raised as ServerError."""
    api.submit(request, decoupled_error=decoupled_error)
    response = await request.single_response()
    if response.error is not None:
        raise response.error
    return response
