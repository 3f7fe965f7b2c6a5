"""PyTriton's ``Triton`` and ``TritonConfig`` (``pytriton.triton``), served by triton-serve in this process.

``Triton`` is a ``triton_serve.inprocess.Server`` with HTTP, gRPC and metrics on PyTriton's ports
(8000, 8001, 8002), in explicit model-control mode; ``bind`` loads a model whose config is built in
memory and whose requests reach the bound function directly (see the ``pytriton`` backend).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

from triton_serve.inprocess import Server, ServerError

from .binding import BINDING_FILE, Binding, register, unregister
from .decorators import TritonContext
from .exceptions import PyTritonBadParameterError, PyTritonInvalidOperationError, PyTritonValidationError
from .isolation import pickle_function
from .model_config import ModelConfig, Tensor, to_config_message, triton_model_config

log = logging.getLogger("triton_serve_pytriton")
MONITORING_PERIOD_S = 10.0
ENV_PREFIX = "PYTRITON_TRITON_CONFIG_"


@dataclasses.dataclass
class TritonConfig:
    """The server's settings, by tritonserver's flag names (every field of PyTriton's TritonConfig is
    accepted; those triton-serve has no use for are ignored with a warning: see docs/python-native.md)."""

    model_repository: pathlib.Path | None = None
    id: str | None = None
    log_verbose: int | None = None
    log_file: pathlib.Path | None = None
    exit_timeout_secs: int | None = None
    exit_on_error: bool | None = None
    strict_readiness: bool | None = None
    allow_http: bool | None = None
    http_address: str | None = None
    http_port: int | None = None
    http_header_forward_pattern: str | None = None
    http_thread_count: int | None = None
    http_restricted_api: str | None = None
    allow_grpc: bool | None = None
    grpc_address: str | None = None
    grpc_port: int | None = None
    grpc_header_forward_pattern: str | None = None
    grpc_infer_allocation_pool_size: int | None = None
    grpc_use_ssl: bool | None = None
    grpc_use_ssl_mutual: bool | None = None
    grpc_server_cert: pathlib.Path | None = None
    grpc_server_key: pathlib.Path | None = None
    grpc_root_cert: pathlib.Path | None = None
    grpc_infer_response_compression_level: str | None = None
    grpc_keepalive_time: int | None = None
    grpc_keepalive_timeout: int | None = None
    grpc_keepalive_permit_without_calls: bool | None = None
    grpc_http2_max_pings_without_data: int | None = None
    grpc_http2_min_recv_ping_interval_without_data: int | None = None
    grpc_http2_max_ping_strikes: int | None = None
    grpc_restricted_protocol: str | None = None
    allow_metrics: bool | None = None
    allow_gpu_metrics: bool | None = None
    allow_cpu_metrics: bool | None = None
    metrics_interval_ms: int | None = None
    metrics_port: int | None = None
    metrics_address: str | None = None
    allow_sagemaker: bool | None = None
    sagemaker_port: int | None = None
    sagemaker_safe_port_range: str | None = None
    sagemaker_thread_count: int | None = None
    allow_vertex_ai: bool | None = None
    vertex_ai_port: int | None = None
    vertex_ai_thread_count: int | None = None
    vertex_ai_default_model: str | None = None
    metrics_config: list[str] | None = None
    trace_config: list[str] | None = None
    cache_config: list[str] | None = None
    cache_directory: str | None = None
    buffer_manager_thread_count: int | None = None

    def __post_init__(self) -> None:
        if self.allow_http not in (True, None) and self.allow_grpc not in (True, None):
            raise PyTritonValidationError("The `http` or `grpc` endpoint has to be allowed.")

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TritonConfig:
        """A TritonConfig from a dict of field values (strings are converted; unknown keys are ignored)."""
        fields = {field.name: field for field in dataclasses.fields(cls)}
        for name in config:
            if name not in fields:
                log.warning("Ignoring %s=%s as could not find matching config field.", name, config[name])
        return cls(**{name: _convert(fields[name].type, value) for name, value in config.items() if name in fields})

    @classmethod
    def from_env(cls) -> TritonConfig:
        """A TritonConfig from ``PYTRITON_TRITON_CONFIG_<FIELD>`` environment variables (list fields:
        ``..._<FIELD>_<index>``)."""
        config: dict[str, Any] = {}
        listed: dict[str, dict[int, str]] = {}
        for name, value in os.environ.items():
            if not name.startswith(ENV_PREFIX):
                continue
            key = name[len(ENV_PREFIX):].lower()
            match = re.fullmatch(r"(.+?)_(\d+)", key)
            if match:
                listed.setdefault(match.group(1), {})[int(match.group(2))] = value
            else:
                config[key] = value
        for key, items in listed.items():
            config[key] = [items[index] for index in sorted(items)]
        return cls.from_dict(config)


def _convert(annotation: Any, value: Any) -> Any:
    if value is None or not isinstance(value, str):
        return value
    text = str(annotation)
    if "bool" in text:
        return value.strip().lower() in ("1", "true", "yes", "on")
    if "int" in text:
        return int(value)
    if "list" in text:
        return value.split(",")
    if "Path" in text:
        return pathlib.Path(value)
    return value


# TritonConfig fields that map onto triton-serve's ServerOptions of the same meaning.
_SAME_OPTIONS = ("exit_timeout_secs", "exit_on_error", "strict_readiness", "http_address",
                 "http_header_forward_pattern", "grpc_address", "grpc_header_forward_pattern", "metrics_address",
                 "allow_gpu_metrics", "allow_cpu_metrics", "metrics_interval_ms")
_IGNORED = {"log_verbose", "log_file", "http_thread_count", "http_restricted_api", "grpc_infer_allocation_pool_size",
            "grpc_use_ssl", "grpc_use_ssl_mutual", "grpc_server_cert", "grpc_server_key", "grpc_root_cert",
            "grpc_infer_response_compression_level", "grpc_keepalive_time", "grpc_keepalive_timeout",
            "grpc_keepalive_permit_without_calls", "grpc_http2_max_pings_without_data",
            "grpc_http2_min_recv_ping_interval_without_data", "grpc_http2_max_ping_strikes",
            "grpc_restricted_protocol", "allow_sagemaker", "sagemaker_port", "sagemaker_safe_port_range",
            "sagemaker_thread_count", "allow_vertex_ai", "vertex_ai_port", "vertex_ai_thread_count",
            "vertex_ai_default_model", "metrics_config", "trace_config", "cache_directory",
            "buffer_manager_thread_count"}


class Triton:
    """A triton-serve server in this process, serving the functions bound to it over HTTP and gRPC
    (and Python callers through ``server``). ``with Triton() as triton:`` starts it; ``bind`` adds
    models (before or after the start); ``serve`` blocks until the process is interrupted or ``stop``
    is called; ``run`` returns at once."""

    def __init__(self, *, config: TritonConfig | None = None, workspace: Any = None,
                 triton_lifecycle_policy: Any = None, security_config: Any = None) -> None:
        defaults = {k: v for k, v in TritonConfig().to_dict().items() if v is not None}
        from_env = {k: v for k, v in TritonConfig.from_env().to_dict().items() if v is not None}
        explicit = {k: v for k, v in (config.to_dict() if config else {}).items() if v is not None}
        self.config = TritonConfig(**{**defaults, **from_env, **explicit})
        self._bindings: dict[str, Binding] = {}
        self._context = TritonContext()
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        self.server = self._make_server(self.config)

    @staticmethod
    def _make_server(config: TritonConfig) -> Server:
        options: dict[str, Any] = {name: getattr(config, name) for name in _SAME_OPTIONS
                                   if getattr(config, name) is not None}
        if config.id is not None:
            options["server_id"] = config.id
        if config.cache_config:
            name, _, rest = ",".join(config.cache_config).partition(",")
            settings = dict(item.split("=", 1) for item in rest.split(",") if "=" in item)
            options["cache_config"] = (name, settings)
        for name in sorted(_IGNORED):
            if getattr(config, name) is not None:
                log.warning("TritonConfig.%s is not used by triton-serve; ignoring it", name)
        if config.model_repository is not None:
            options.update(model_control_mode="explicit", load_models=["*"])
            return Server(config.model_repository, **options)
        return Server(None, **options)

    # ---- binding --------------------------------------------------------------------------------

    def bind(self, model_name: str, infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
             inputs: Sequence[Tensor], outputs: Sequence[Tensor], model_version: int = 1,
             config: ModelConfig | None = None, strict: bool = False, trace_config: list[str] | None = None,
             *, process_isolation: bool = False) -> None:
        """Serve ``infer_func`` (or one function per instance, from a list) as model ``model_name``.
        ``strict`` checks each result's outputs against ``outputs`` (dtype, shape, no extra output);
        ``process_isolation`` runs each instance's function in a worker process of its own (the
        function must then be picklable and importable). Raises at once for a bad name, a name bound
        twice, or bad tensors; a model that fails to load raises with the reason."""
        _validate_model_name(model_name)
        functions = [infer_func] if callable(infer_func) else list(infer_func)
        if not functions or not all(callable(function) for function in functions):
            raise PyTritonValidationError("inference_fn has to be either callable or sequence of callables")
        model = triton_model_config(model_name, model_version, config or ModelConfig(), inputs, outputs,
                                    len(functions))
        message = to_config_message(model)
        pickled: list[bytes] = []
        if process_isolation:
            for function in functions:
                try:
                    pickled.append(pickle_function(function))
                except ValueError as error:
                    raise PyTritonBadParameterError(f"model '{model_name}' asks for process isolation, but its "
                                                    f"inference function cannot go to a worker process: {error}") from None
        with self._lock:
            if model_name in self._bindings:
                raise PyTritonInvalidOperationError("Cannot add model with the same name twice.")
            for function in functions:
                owner = getattr(function, "__self__", function)
                try:
                    setattr(owner, "__triton_context__", self._context)  # what @triton_context reads
                except AttributeError:
                    pass  # a builtin: it cannot use @triton_context anyway
                self._context.model_configs[function] = model
            binding = Binding(model, functions, strict=strict, isolated=process_isolation, pickled=pickled,
                              on_unrecoverable=self._on_unrecoverable)
            self._bindings[model_name] = binding
            register(binding)
            if self.server.is_running:
                self._load(binding, message)

    def _load(self, binding: Binding, message: Any = None) -> None:
        model = binding.config
        try:
            self.server.load(model.model_name, config=message or to_config_message(model),
                             files={f"{model.model_version}/{BINDING_FILE}": binding.key.encode()})
        except ServerError as error:
            raise PyTritonInvalidOperationError(f"model '{model.model_name}' failed to load: {error}") from None

    def _on_unrecoverable(self, error: BaseException) -> None:
        log.error("unrecoverable error in an inference function, stopping: %s", error)
        threading.Thread(target=self.stop, name="pytriton-stop", daemon=True).start()

    # ---- life cycle -----------------------------------------------------------------------------

    def run(self) -> None:
        """Start serving (if not yet) and load every bound model; return at once."""
        with self._lock:
            if not self.server.is_running:
                if self._stopped.is_set():
                    raise PyTritonInvalidOperationError("this Triton was stopped; make a new one")
                config = self.config
                ports = {"HTTP": (config.http_address, config.http_port or 8000, config.allow_http),
                         "gRPC": (config.grpc_address, config.grpc_port or 8001, config.allow_grpc),
                         "metrics": (config.metrics_address, config.metrics_port or 8002, config.allow_metrics)}
                served = {what: (address or "0.0.0.0", port) for what, (address, port, allowed) in ports.items()
                          if allowed in (True, None)}
                self.server.start(http_port=served["HTTP"][1] if "HTTP" in served else None,
                                  grpc_port=served["gRPC"][1] if "gRPC" in served else None,
                                  metrics_port=served["metrics"][1] if "metrics" in served else None)
                _log_somewhere()
                for what, (address, port) in served.items():
                    log.info("serving %s on %s:%d", what, address, port)
                for binding in self._bindings.values():
                    self._load(binding)

    def connect(self) -> None:
        """The same as ``run``: the server is this process, there is nothing else to connect to."""
        self.run()

    def serve(self, monitoring_period_s: float = MONITORING_PERIOD_S) -> None:
        """Start serving and block until ``stop`` is called or the process gets SIGINT (Ctrl+C) or SIGTERM
        (what ``docker stop`` and Kubernetes send); either signal stops as ``stop`` does, letting requests in
        flight finish within ``exit_timeout_secs``."""
        self.run()
        on_main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _raise_terminated) if on_main_thread else None
        try:
            while not self._stopped.wait(monitoring_period_s):
                pass
        except KeyboardInterrupt:
            log.info("SIGINT received, exiting.")
        except _Terminated:
            log.info("SIGTERM received, exiting.")
        finally:
            if on_main_thread:
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        self.stop()

    def stop(self) -> bool:
        """Stop serving and unload every model; False when already stopped."""
        with self._lock:
            if self._stopped.is_set():
                return False
            self._stopped.set()
            self.server.stop()
            for binding in self._bindings.values():
                unregister(binding)
            return True

    def is_alive(self) -> bool:
        """Whether the server serves."""
        return self.server.is_running

    def is_connected(self) -> bool:
        """Whether the server serves (there is no separate connection)."""
        return self.server.is_running

    def __enter__(self) -> Triton:
        self.run()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _log_somewhere() -> None:
    """A script that set up no logging still sees where it serves and why it stops, as tritonserver's own output
    shows them under PyTriton: the binding's lines then go to stderr. A script's own set-up takes precedence."""
    if not logging.getLogger().hasHandlers() and log.level == logging.NOTSET:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class _Terminated(Exception):
    """SIGTERM arrived while ``serve`` waited (raised in the main thread, as SIGINT raises KeyboardInterrupt)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated


def _validate_model_name(name: str) -> None:
    if not name:
        raise PyTritonValidationError("Model name cannot be empty")
    if not re.fullmatch(r"[a-zA-Z0-9._-]+", name):
        raise PyTritonValidationError("Model name can only contain alphanumeric characters, dots, underscores "
                                      "and dashes")


__all__ = ["Triton", "TritonConfig"]
