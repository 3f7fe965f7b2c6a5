"""The HTTP and gRPC front-ends of one process, serving the data-plane seam (the owner's data plane, or a front-end
process's forwarder)."""
from __future__ import annotations

import asyncio
import dataclasses
import socket
from dataclasses import dataclass, field
from collections.abc import Coroutine
from typing import Any

from .busy_poll import DEFAULT_MICROSECONDS, BusyPoll
from .grpc.server import GrpcFrontend, GrpcOptions
from .http.app import DEFAULT_MAX_INPUT_SIZE, HttpFrontend
from .http.infer_protocol import http_protocol
from .http.serving import GRACEFUL_TIMEOUT_S, listen_socket, serve_http
from .header_forwarding import header_forwarder
from .http_apps import AsgiApp, HttpAppRegistry, http_apps_of
from .openai_listener import OPENAI_PREFIX, OpenAIOptions, openai_port_app, require_openai_plugin, restrict_openai
from .platforms.listeners import PlatformOptions, bind_platform_listeners
from ..seam import DataPlaneAPI
from .restricted import RestrictionCheck, Restrictions, grpc_interceptors, kserve_category, restrictions_from_json


@dataclass
class FrontendOptions:
    """What a front-end needs to listen and translate protocols (every field is a plain value, so a
    front-end process receives them as JSON)."""

    http_address: str = "0.0.0.0"
    http_port: int = 8000
    allow_http: bool = True
    http_server: str = "uvicorn"  # or "hypercorn"
    http_max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    reuse_http_port: bool = False  # --reuse-http-port: other processes may bind the port too
    http_restricted_api: Restrictions = field(default_factory=dict)
    http_header_forward_pattern: str | None = None  # None: forward no header
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    allow_grpc: bool = True
    reuse_grpc_port: bool = False
    grpc_options: GrpcOptions = field(default_factory=GrpcOptions)
    grpc_restricted_protocol: Restrictions = field(default_factory=dict)
    grpc_header_forward_pattern: str | None = None
    exit_timeout_secs: float = GRACEFUL_TIMEOUT_S  # how long a graceful stop waits for in-flight requests
    busy_poll_microseconds: int = DEFAULT_MICROSECONDS  # --busy-poll-microseconds (busy_poll.py)
    http_app_plugins: list[str] = field(default_factory=list)  # installed plugins serving more HTTP paths
    platforms: PlatformOptions = field(default_factory=PlatformOptions)  # the SageMaker and Vertex AI listeners
    openai: OpenAIOptions = field(default_factory=OpenAIOptions)  # --openai-port, --openai-restricted-api

    def to_dict(self) -> dict[str, Any]:
        """The options as plain values (JSON for a front-end process)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FrontendOptions:
        """The options back from ``to_dict``'s values."""
        return cls(**{**values, "grpc_options": GrpcOptions(**values["grpc_options"]),
                      "platforms": PlatformOptions(**values["platforms"]),
                      "openai": OpenAIOptions(**{**values["openai"], "restricted_api": restrictions_from_json(
                          values["openai"]["restricted_api"]), "metrics_endpoint": _pair(
                          values["openai"]["metrics_endpoint"])}),
                      "http_restricted_api": restrictions_from_json(values["http_restricted_api"]),
                      "grpc_restricted_protocol": restrictions_from_json(values["grpc_restricted_protocol"])})


def _pair(value: list[Any] | None) -> tuple[str, int] | None:
    """A (host, port) pair back from JSON, which has no tuples."""
    return None if value is None else (value[0], value[1])


class Frontends:
    """``await start()`` binds and serves both protocols; ``request_stop()`` begins a graceful stop
    (new connections refused, in-flight requests finish); ``await wait_stopped()``.

    ``reuse_port`` lets several front-end processes accept on the same ports (SO_REUSEPORT). ``http_apps``: the
    plugins' apps on the HTTP port (None: those of the plugins ``options.http_app_plugins`` names, loaded here).
    """

    def __init__(self, api: DataPlaneAPI, options: FrontendOptions, *, reuse_port: bool = False,
                 http_apps: HttpAppRegistry | None = None) -> None:
        self.api = api
        self.options = options
        self.reuse_port = reuse_port
        self.http_apps = http_apps
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Bind the ports and begin serving; raise ServerError (a taken port, a bad setting) before serving."""
        options = self.options
        busy_poll = BusyPoll(asyncio.get_running_loop(), options.busy_poll_microseconds)
        http_forwarder = header_forwarder(options.http_header_forward_pattern, "--http-header-forward-pattern")
        grpc_forwarder = header_forwarder(options.grpc_header_forward_pattern, "--grpc-header-forward-pattern")
        # the SageMaker and Vertex AI listeners first: their settings may fail the start before anything serves
        platforms = await bind_platform_listeners(self.api, options.platforms, reuse_port=self.reuse_port,
                                                  max_input_size=options.http_max_input_size,
                                                  restrictions=options.http_restricted_api)
        http_socket = None
        if options.allow_http:  # bind first: a taken port fails the start before anything serves
            try:
                http_socket = listen_socket(options.http_address, options.http_port,
                                            reuse_port=self.reuse_port or options.reuse_http_port)
            except BaseException:
                for _app, platform_socket in platforms:
                    platform_socket.close()
                raise
        openai_socket, apps = self._bind_openai(http_socket, platforms)
        if options.allow_grpc:
            grpc_frontend = GrpcFrontend(self.api, options.grpc_address, options.grpc_port, options.grpc_options,
                                         reuse_port=self.reuse_port or options.reuse_grpc_port,
                                         interceptors=grpc_interceptors(options.grpc_restricted_protocol),
                                         header_forwarder=grpc_forwarder, busy_poll=busy_poll)
            try:
                await grpc_frontend.start()
            except BaseException:
                for sock in [http_socket, openai_socket, *(platform_socket for _app, platform_socket in platforms)]:
                    if sock is not None:
                        sock.close()
                raise
            self._tasks.append(asyncio.create_task(self._serve_grpc(grpc_frontend)))
        for platform_app, platform_socket in platforms:
            self._tasks.append(asyncio.create_task(serve_http(platform_app, platform_socket, options.http_server,
                                                              self._stopping, options.exit_timeout_secs)))
        mounts: dict[str, AsgiApp] = {}
        if http_socket is not None or openai_socket is not None:
            mounts = apps.apps(self.api, options.http_max_input_size, options.openai)
            if OPENAI_PREFIX in mounts:
                mounts[OPENAI_PREFIX] = restrict_openai(mounts[OPENAI_PREFIX], options.openai.restricted_api)
        if openai_socket is not None:
            self._tasks.append(asyncio.create_task(serve_http(openai_port_app(mounts, self.api, options.openai),
                                                              openai_socket,
                                                              options.http_server, self._stopping,
                                                              options.exit_timeout_secs)))
        if http_socket is not None:
            http_frontend = HttpFrontend(self.api, options.http_max_input_size, header_forwarder=http_forwarder,
                                         mounts=mounts)
            check = RestrictionCheck(options.http_restricted_api)  # one check, for the ASGI app and the fast /infer
            app = check.guard(http_frontend.app(), kserve_category)
            protocol = http_protocol(http_frontend, check, busy_poll)
            self._tasks.append(asyncio.create_task(serve_http(app, http_socket, options.http_server, self._stopping,
                                                              options.exit_timeout_secs, protocol=protocol)))

    def _bind_openai(self, http_socket: socket.socket | None,
                     platforms: list[tuple[Any, socket.socket]]) -> tuple[socket.socket | None, HttpAppRegistry]:
        """``--openai-port``'s socket (None without the flag) and the plugins' HTTP apps; a missing OpenAI
        plugin or a taken port closes what is bound and fails the start."""
        options = self.options
        if http_socket is None and options.openai.port is None:
            return None, HttpAppRegistry()  # no HTTP listener: no plugin app is loaded
        apps = self.http_apps if self.http_apps is not None else http_apps_of(options.http_app_plugins)
        if options.openai.port is None:
            return None, apps
        try:
            require_openai_plugin(options.openai, apps)
            return listen_socket(options.http_address, options.openai.port,
                                 reuse_port=self.reuse_port or options.reuse_http_port, what="OpenAI"), apps
        except BaseException:
            for sock in [http_socket, *(platform_socket for _app, platform_socket in platforms)]:
                if sock is not None:
                    sock.close()
            raise

    async def _serve_grpc(self, grpc_frontend: GrpcFrontend) -> None:
        await self._stopping.wait()
        await grpc_frontend.stop(self.options.exit_timeout_secs)

    def request_stop(self) -> None:
        """Begin a graceful stop: refuse new connections, let in-flight requests finish."""
        self._stopping.set()

    async def wait_stopped(self) -> None:
        """Wait until a stop was asked for and both protocols have drained."""
        await self._stopping.wait()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop where uvloop is installed (HTTP and gRPC both serve faster on it), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_on_fast_loop(main: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run`` on the loop ``new_event_loop`` makes."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
