"""The server: wires plugins, repository, data plane and front-ends together and runs them on one loop."""
from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .frontend.busy_poll import DEFAULT_MICROSECONDS
from .caching import ResponseCache
from .dataplane import DataPlane
from .errors import ServerError, Status
from .examples import EXAMPLE_REPOSITORY, servable_examples
from .frontend_pool import FrontendPool
from .frontend.frontends import FrontendOptions, Frontends
from .frontend.grpc.server import GrpcOptions
from .frontend.http.app import DEFAULT_MAX_INPUT_SIZE
from .log_settings import LogControl, LogSettings
from .metrics import MetricsConfig
from .metrics_endpoint import MetricsEndpoint
from .frontend.openai_listener import OpenAIOptions, require_openai_plugin, told_by_server
from .frontend.platforms.listeners import PlatformOptions
from .pluginhost import PluginHost
from .polling import RepositoryPoller
from .ratelimit import RateLimiter
from .repository import ModelRepository, RepositoryOptions
from .frontend.restricted import Restrictions
from .trace_settings import TraceConfig
from .tracing import Tracer

log = logging.getLogger("triton_serve")

# Extensions the core serves itself; the list in server metadata holds only what works
# (cuda_shared_memory too, as in Triton's CPU builds: without a GPU, registering a region says so).
CORE_EXTENSIONS = ["classification", "model_repository", "model_repository(unload_dependents)",
                   "model_configuration", "system_shared_memory",
                   "cuda_shared_memory", "binary_tensor_data", "parameters", "statistics", "trace", "logging"]
# Extensions that exist once a plugin registers the scheduler behind them.
SCHEDULER_EXTENSIONS = {"dynamic_batching": "schedule_policy", "sequence_batching": "sequence"}
# The example repository ships inside the package, so that `triton-serve` alone serves it from any install.


@dataclass
class ServerOptions:
    """Everything the CLI can set, with Triton's defaults (except ``exit_on_error``: see docs)."""

    model_repositories: list[str] = field(default_factory=list)
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    allow_http: bool = True
    http_server: str = "uvicorn"  # or "hypercorn"
    # Processes that accept HTTP and gRPC and forward to this one (SO_REUSEPORT); 0: serve both
    # protocols in this process. The CLI's default is one per core.
    frontend_processes: int = 0
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    allow_grpc: bool = True
    grpc_options: GrpcOptions = field(default_factory=GrpcOptions)
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True  # only where nvidia-ml-py imports and a GPU is present
    metrics_interval_ms: float = 2000.0  # how often CPU and GPU metrics are polled
    metrics_config: MetricsConfig = field(default_factory=MetricsConfig)
    exit_on_error: bool = False
    strict_readiness: bool = True
    strict_model_config: bool = False
    disable_auto_complete_config: bool = False
    model_control_mode: str = "none"  # none, explicit or poll
    repository_poll_secs: float = 15  # poll mode: seconds between polls; 0: poll only at start-up
    load_models: list[str] = field(default_factory=list)
    model_config_name: str = ""
    http_max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    cache_config: tuple[str, dict[str, str]] | None = None
    blocked_plugins: list[str] = field(default_factory=list)
    rate_limit: str = "off"  # or "execution_count"
    rate_limit_resources: dict[tuple[str, int | None], int] = field(default_factory=dict)
    extra_plugins: list[tuple[str, Any]] = field(default_factory=list)
    server_id: str = "triton"  # --id: the server metadata's name
    exit_timeout_secs: int = 30  # how long a graceful stop waits for in-flight requests
    busy_poll_microseconds: int = DEFAULT_MICROSECONDS  # the longest a loop polls after an answer (busy_poll.py)
    reuse_http_port: bool = False
    reuse_grpc_port: bool = False
    # --http-restricted-api / --grpc-restricted-protocol: category -> (header, value); see docs/access-control.md
    http_restricted_api: Restrictions = field(default_factory=dict)
    grpc_restricted_protocol: Restrictions = field(default_factory=dict)
    http_header_forward_pattern: str | None = None  # None: no header becomes a request parameter
    grpc_header_forward_pattern: str | None = None
    model_namespacing: bool = False  # --model-namespacing: repositories may hold models of one name
    allow_client_shm: bool = True  # --allow-client-shm (Triton 2.69, whose default is false): 2.51 allowed it
    # --log-*: what /v2/logging reports at start; the CLI applies them to the process (apply_log_settings)
    log_settings: LogSettings = field(default_factory=LogSettings)
    trace_config: TraceConfig = field(default_factory=TraceConfig)  # --trace-config (docs/tracing.md)
    platforms: PlatformOptions = field(default_factory=PlatformOptions)  # --allow-sagemaker, --allow-vertex-ai
    openai: OpenAIOptions = field(default_factory=OpenAIOptions)  # --openai-port, --openai-restricted-api

    def frontend_options(self) -> FrontendOptions:
        """The part of these options the HTTP and gRPC front-end processes need."""
        return FrontendOptions(
            http_address=self.http_address, http_port=self.http_port, allow_http=self.allow_http,
            http_server=self.http_server, http_max_input_size=self.http_max_input_size,
            grpc_address=self.grpc_address, grpc_port=self.grpc_port, allow_grpc=self.allow_grpc,
            grpc_options=self.grpc_options, exit_timeout_secs=self.exit_timeout_secs,
            busy_poll_microseconds=self.busy_poll_microseconds,
            reuse_http_port=self.reuse_http_port, reuse_grpc_port=self.reuse_grpc_port,
            http_restricted_api=self.http_restricted_api, grpc_restricted_protocol=self.grpc_restricted_protocol,
            http_header_forward_pattern=self.http_header_forward_pattern,
            grpc_header_forward_pattern=self.grpc_header_forward_pattern, platforms=self.platforms,
            openai=told_by_server(self.openai, model_control_mode=self.model_control_mode,
                                  metrics_address=self.metrics_address if self.allow_metrics else None,
                                  metrics_port=self.metrics_port))


class Server:
    """One running triton-serve: ``await start()``, then ``await wait_stopped()`` or ``await stop()``."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.plugins = PluginHost(blocked=options.blocked_plugins, extra=options.extra_plugins)
        self.plugins.backends.options = options.backend_config
        locations = options.model_repositories or [str(EXAMPLE_REPOSITORY)]
        sources = [self.plugins.repository_source(location) for location in locations]
        self.repository = ModelRepository(sources, self.plugins, RepositoryOptions(
            strict_model_config=options.strict_model_config,
            disable_auto_complete_config=options.disable_auto_complete_config,
            model_config_name=options.model_config_name, drain_timeout_s=options.exit_timeout_secs,
            rate_limiter=RateLimiter(options.rate_limit == "execution_count", options.rate_limit_resources),
            latency=options.metrics_config.latency_settings() if options.allow_metrics else None,
            model_namespacing=options.model_namespacing))
        extensions = CORE_EXTENSIONS + [extension for kind, extension in SCHEDULER_EXTENSIONS.items()
                                        if self.plugins.schedulers.get(kind) is not None]
        self.dataplane = DataPlane(self.repository, strict_readiness=options.strict_readiness,
                                   extensions=extensions, cache=self._make_cache(),
                                   control_mode=options.model_control_mode, server_id=options.server_id,
                                   log_control=LogControl(options.log_settings),
                                   tracer=Tracer(options.trace_config))
        self.dataplane.accepting = False  # not ready until every front-end serves
        self.dataplane.shared_memory.allow_client = options.allow_client_shm
        self.frontends: Frontends | FrontendPool | None = None
        self.metrics: MetricsEndpoint | None = None
        if options.allow_metrics:
            self.metrics = MetricsEndpoint(
                self.repository, options.metrics_config, address=options.metrics_address, port=options.metrics_port,
                cache_enabled=self.dataplane.cache is not None, cpu=options.allow_cpu_metrics,
                gpu=options.allow_gpu_metrics, interval_ms=options.metrics_interval_ms)
            self.dataplane.metrics_exposition = self.metrics.exposition  # what a Vertex AI redirect to metrics reads
        self.poller: RepositoryPoller | None = None
        if options.model_control_mode == "poll" and options.repository_poll_secs > 0:
            self.poller = RepositoryPoller(self.repository, options.repository_poll_secs)
        self._stopping = asyncio.Event()
        self._stopped = asyncio.Event()

    def _make_cache(self) -> ResponseCache | None:
        if self.options.cache_config is None:
            return None
        name, cache_options = self.options.cache_config
        factory = self.plugins.caches.get(name)
        if factory is None:
            raise ServerError(f"--cache-config names cache '{name}', which no installed plugin provides "
                              f"(available: {', '.join(self.plugins.caches.names()) or 'none'})", Status.NOT_FOUND)
        return factory(cache_options)

    async def start(self) -> None:
        """Load the models the control mode asks for, then open the front-ends (in this process, or
        in ``frontend_processes`` processes of their own)."""
        require_openai_plugin(self.options.openai, self.plugins.http_apps)  # before models take minutes to load
        await self._load_initial_models()
        options = self.options
        if self.metrics is not None:
            try:
                await self.metrics.start()
            except BaseException:
                self.metrics = None
                await self.repository.shutdown()
                raise
        if not (options.allow_http or options.allow_grpc or options.platforms.any_on
                or options.openai.port is not None):
            self.dataplane.accepting = True
            self._start_polling()
            return
        frontend_options = options.frontend_options()
        frontend_options.http_app_plugins = self.plugins.http_apps.plugins()
        if options.frontend_processes > 0:
            self.frontends = FrontendPool(self.dataplane, frontend_options, options.frontend_processes)
        else:
            self.frontends = Frontends(self.dataplane, frontend_options, http_apps=self.plugins.http_apps)
        try:
            await self.frontends.start()
        except BaseException:
            self.frontends = None
            if self.metrics is not None:
                await self.metrics.stop()
                self.metrics = None
            await self.repository.shutdown()
            raise
        self.dataplane.accepting = not self._stopping.is_set()
        self._start_polling()
        gc.freeze()  # what start-up made lives on: later collections need not walk it

    def _start_polling(self) -> None:
        if self.poller is not None and not self._stopping.is_set():
            self.poller.start()

    async def _load_initial_models(self) -> None:
        mode = self.options.model_control_mode
        if mode not in ("none", "poll", "explicit"):
            raise ServerError(f"--model-control-mode={mode} is not supported; use none, explicit or poll")
        names = await self.repository.model_names()  # in every mode: a repository that cannot be listed stops start-up
        if not self.options.model_repositories and mode == "none":
            names = servable_examples(self.plugins, names, self.options.model_config_name)
        if mode == "explicit" and "*" not in self.options.load_models:
            missing = [name for name in self.options.load_models if name not in names]
            for name in missing:  # Triton's words; its start then fails (as tritonserver's does by default)
                log.error("failed to poll model '%s': model not found in any model repository.", name)
            if missing:
                raise ServerError("failed to load all models", Status.INTERNAL)
            names = self.options.load_models
        models = await asyncio.gather(*(self.repository.load(name) for name in names))
        failed = [m.name for m in models if not m.is_ready()]
        if failed:
            log.error("model(s) failed to load: %s", ", ".join(failed))
            if self.options.exit_on_error:
                await self.repository.shutdown()
                raise ServerError(f"exiting because model(s) failed to load (--exit-on-error): "
                                  f"{', '.join(failed)}", Status.UNAVAILABLE)

    def request_stop(self) -> None:
        """Begin a graceful stop (signal handlers call this): readiness turns false at once."""
        self.dataplane.accepting = False
        if self.frontends is not None:
            self.frontends.request_stop()
        self._stopping.set()

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish, unload every model, unmap shared memory."""
        self.request_stop()
        if self.frontends is not None:
            await self.frontends.wait_stopped()
        if self.metrics is not None:
            await self.metrics.stop()
        if self.poller is not None:
            await self.poller.stop()
        await self.repository.shutdown()
        if self.dataplane.cache is not None:
            await self.dataplane.cache.close()
        self.dataplane.shared_memory.close()
        await self.dataplane.tracer.close()
        self.dataplane.is_live = False
        self._stopped.set()

    async def wait_stopped(self) -> None:
        """Return once the server was asked to stop and has stopped."""
        await self._stopping.wait()
        if not self._stopped.is_set():
            await self.stop()
