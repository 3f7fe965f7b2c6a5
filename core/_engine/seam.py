"""The data-plane seam: the one API every front-end calls, answered by ``DataPlane`` in the model owner and
forwarded, call by call, from front-end processes (``RemoteDataPlane``) and other hosts (triton-serve-ray's
``ChannelDataPlane``), both ``ForwardingDataPlane``s."""
from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

from .errors import ServerError, Status
from .inference import InferenceRequest, InferenceResponse
from .protos.model_config_pb2 import ModelConfig
from .trace_settings import SettingUpdate


# What ``DataPlaneAPI.metrics_text`` returns: Prometheus's text exposition format.
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


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

    async def metrics_text(self) -> bytes:
        """What the metrics port serves now (``PROMETHEUS_TEXT``); ServerError (UNAVAILABLE) when metrics are off."""

    def submit(self, request: InferenceRequest, *, decoupled_error: str | None = None) -> None:
        """Start ``request``; its 0..N responses reach its sink (or ``request.responses()``). Raise ServerError
        when it cannot start. ``decoupled_error``: a unary front-end's refusal of decoupled models."""


def _call_signature(method: str) -> inspect.Signature:
    """The seam's signature of ``method`` without ``self``; its parameters must all be passable by position,
    since a forwarded call crosses as the tuple of its arguments."""
    signature = inspect.signature(getattr(DataPlaneAPI, method))
    parameters = list(signature.parameters.values())[1:]
    if any(parameter.kind is not parameter.POSITIONAL_OR_KEYWORD for parameter in parameters):
        raise TypeError(f"DataPlaneAPI.{method}: a forwarded call takes plain parameters (no *, *args or **kwargs)")
    return signature.replace(parameters=parameters)


# The seam's calls, by name, with the signature a forwarder binds their arguments to: what a front-end process
# forwards to the model owner, and all the owner answers.
REMOTE_CALLS: Mapping[str, inspect.Signature] = MappingProxyType({
    name: _call_signature(name) for name, member in vars(DataPlaneAPI).items() if inspect.iscoroutinefunction(member)})


class ForwardingDataPlane(ABC):
    """The seam where no model is (a front-end process, triton-serve-ray's front door): every call of
    ``REMOTE_CALLS`` the subclass does not define itself is forwarded by ``forward``, its one call frame.

    A call is bound to the seam's signature first, as a local call would be: arguments by position or by
    keyword, a wrong one raises TypeError at the call, the seam's defaults are filled in. ``forward`` gets
    them by name in the seam's order; what crosses is ``tuple(arguments.values())``, which the receiver
    passes to its data plane with ``call_by_name``. A subclass defines ``forward`` and ``submit`` and sets
    ``trace_armed`` and ``accepting``; so typed, it is a ``DataPlaneAPI`` (mypy checks it against the seam).
    """

    trace_armed: bool
    accepting: bool

    @abstractmethod
    async def forward(self, method: str, arguments: dict[str, Any]) -> Any:
        """Send the seam call ``method`` on and return its answer (raise its ServerError)."""

    @abstractmethod
    def submit(self, request: InferenceRequest, *, decoupled_error: str | None = None) -> None:
        """Start ``request`` where its model is (``DataPlaneAPI.submit``)."""

    def __getattr__(self, method: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        signature = REMOTE_CALLS.get(method)
        if signature is None:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{method}'")

        parameters = signature.parameters

        def call(*args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
            if not kwargs and len(args) == len(parameters):  # the front-ends' calls: every argument, in order
                return self.forward(method, dict(zip(parameters, args)))
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return self.forward(method, bound.arguments)
        call.__name__ = call.__qualname__ = method
        return call


async def call_by_name(api: DataPlaneAPI, method: str, args: Sequence[Any]) -> Any:
    """Answer the seam call ``method`` that a ``ForwardingDataPlane`` sent with its arguments, on ``api``;
    ServerError (INTERNAL) for a name that is no call of the seam."""
    if method not in REMOTE_CALLS:
        raise ServerError(f"'{method}' is not a call of the data-plane seam", Status.INTERNAL)
    answer: Callable[..., Coroutine[Any, Any, Any]] = getattr(api, method)
    return await answer(*args)


async def infer_one(api: DataPlaneAPI, request: InferenceRequest, decoupled_error: str) -> InferenceResponse:
    """Submit a request that expects exactly one response (HTTP /infer, gRPC ModelInfer) and wait for it; an
    error response is raised as ServerError."""
    api.submit(request, decoupled_error=decoupled_error)
    response = await request.single_response()
    if response.error is not None:
        raise response.error
    return response
