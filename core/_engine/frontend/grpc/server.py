"""Builds and runs the grpc.aio server: message limits, keepalive, compression, TLS and mutual TLS."""
from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ..busy_poll import BusyPoll
from ...seam import DataPlaneAPI
from ...errors import ServerError, unavailable
from ..header_forwarding import HeaderForwarder
from ...protos.grpc_service_pb2_grpc import add_GRPCInferenceServiceServicer_to_server
from ...protos.health_pb2_grpc import add_HealthServicer_to_server
from .health import HealthCheckServicer
from .h2 import PingPolicy
from .native import NativeServer, default_services, method_table
from .service import InferenceServicer

log = logging.getLogger(__name__)

MAX_MESSAGE_SIZE = 2**31 - 1  # Triton's MAX_GRPC_MESSAGE_SIZE (INT32_MAX), far above gRPC's 4 MB default
SHUTDOWN_GRACE_S = 30.0
# Triton's --grpc-infer-response-compression-level as gRPC core's compression levels: core picks, per
# call, an algorithm the client accepts. grpc.aio ignores per-call set_compression, so the level is
# server-wide: every response is compressed, not only inference responses as in Triton.
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}


@dataclass
class GrpcOptions:
    """The ``--grpc-*`` settings beyond address and port, with Triton's defaults; times in milliseconds."""

    use_ssl: bool = False
    use_ssl_mutual: bool = False  # implies use_ssl
    server_cert: str = ""
    server_key: str = ""
    root_cert: str = ""
    infer_response_compression_level: str = "none"
    keepalive_time: int = 7_200_000
    keepalive_timeout: int = 20_000
    keepalive_permit_without_calls: bool = False
    http2_max_pings_without_data: int = 2
    http2_min_recv_ping_interval_without_data: int = 300_000
    http2_max_ping_strikes: int = 2
    max_connection_age: int | None = None
    max_connection_age_grace: int | None = None
    max_message_size: int = MAX_MESSAGE_SIZE  # not a Triton flag: lets tests exercise the limit
    # --grpc-transport: native (native.py over h2.py) or grpcio (grpc.aio); "" picks native
    transport: str = ""


def channel_arguments(options: GrpcOptions) -> list[tuple[str, Any]]:
    arguments: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", options.max_message_size),
        ("grpc.max_receive_message_length", options.max_message_size),
        ("grpc.so_reuseport", 0),  # a port already in use is an error, as in Triton (--reuse-grpc-port=false)
        ("grpc.keepalive_time_ms", options.keepalive_time),
        ("grpc.keepalive_timeout_ms", options.keepalive_timeout),
        ("grpc.keepalive_permit_without_calls", int(options.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", options.http2_max_pings_without_data),
        ("grpc.http2.min_ping_interval_without_data_ms", options.http2_min_recv_ping_interval_without_data),
        ("grpc.http2.max_ping_strikes", options.http2_max_ping_strikes),
        ("grpc.default_compression_level", COMPRESSION_LEVELS[options.infer_response_compression_level]),
    ]
    if options.max_connection_age is not None:
        arguments.append(("grpc.max_connection_age_ms", options.max_connection_age))
    if options.max_connection_age_grace is not None:
        arguments.append(("grpc.max_connection_age_grace_ms", options.max_connection_age_grace))
    return arguments


def _read_pem(path: str, flag: str) -> bytes:
    if not path:
        raise ServerError(f"{flag} is required when SSL is enabled for gRPC")
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ServerError(f"failed to read {flag} file '{path}': {error.strerror}") from None


def tls_context(options: GrpcOptions) -> ssl.SSLContext | None:
    """The native transport's TLS, from the same flags and files as ``server_credentials``: ALPN "h2",
    client certificates required and checked against the root certificate in mutual mode; None without SSL."""
    if not (options.use_ssl or options.use_ssl_mutual):
        return None
    _read_pem(options.server_key, "--grpc-server-key")
    _read_pem(options.server_cert, "--grpc-server-cert")
    root = _read_pem(options.root_cert, "--grpc-root-cert") if options.use_ssl_mutual or options.root_cert else None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    try:
        context.load_cert_chain(options.server_cert, options.server_key)
        if root is not None:
            context.load_verify_locations(cadata=root.decode())
    except (ssl.SSLError, ValueError) as error:
        raise ServerError(f"failed to load the gRPC TLS certificates: {error}") from None
    if options.use_ssl_mutual:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def server_credentials(options: GrpcOptions) -> grpc.ServerCredentials | None:
    """TLS credentials, requiring and verifying client certificates in mutual mode; None without SSL."""
    if not (options.use_ssl or options.use_ssl_mutual):
        return None
    key = _read_pem(options.server_key, "--grpc-server-key")
    cert = _read_pem(options.server_cert, "--grpc-server-cert")
    root = _read_pem(options.root_cert, "--grpc-root-cert") if options.use_ssl_mutual or options.root_cert else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=root,
                                       require_client_auth=options.use_ssl_mutual)


class GrpcFrontend:
    """The gRPC front-end on the server's event loop: ``await start()`` binds and serves, ``await stop()``."""

    def __init__(self, dataplane: DataPlaneAPI, address: str, port: int, options: GrpcOptions, *,
                 reuse_port: bool = False, interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                 header_forwarder: HeaderForwarder | None = None, busy_poll: BusyPoll | None = None) -> None:
        if options.infer_response_compression_level not in COMPRESSION_LEVELS:
            raise ServerError(f"invalid --grpc-infer-response-compression-level "
                              f"'{options.infer_response_compression_level}'; use none, low, medium or high")
        self.dataplane = dataplane
        self.address, self.port = address, port
        self.target = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        self.options = options
        self.reuse_port = reuse_port
        self.interceptors = interceptors
        self.header_forwarder = header_forwarder
        self.busy_poll = busy_poll  # started by the native transport's answers (grpc.aio's are not watched)
        self._server: grpc.aio.Server | None = None
        self._native: NativeServer | None = None

    @property
    def transport(self) -> str:
        """The transport that serves: the one asked for, else native."""
        return self.options.transport or "native"

    async def start(self) -> None:
        if self.transport == "native":
            await self._start_native()
            return
        credentials = server_credentials(self.options)
        arguments = channel_arguments(self.options)
        if self.reuse_port:  # several front-end processes accept on this port
            arguments = [(key, 1 if key == "grpc.so_reuseport" else value) for key, value in arguments]
        server = grpc.aio.server(options=arguments, interceptors=self.interceptors)
        add_GRPCInferenceServiceServicer_to_server(InferenceServicer(self.dataplane, self.header_forwarder), server)
        add_HealthServicer_to_server(HealthCheckServicer(self.dataplane), server)
        try:
            if credentials is None:
                bound = server.add_insecure_port(self.target)
            else:
                bound = server.add_secure_port(self.target, credentials)
        except RuntimeError:
            bound = 0
        if not bound:
            raise unavailable(f"failed to start the gRPC front-end: cannot bind {self.target} "
                              "(address in use or not available)")
        await server.start()
        self._server = server
        log.debug("serving gRPC%s on %s", " with TLS" if credentials is not None else "", self.target)

    async def _start_native(self) -> None:
        options = self.options
        tls = tls_context(options)
        methods = method_table(default_services(InferenceServicer(self.dataplane, self.header_forwarder),
                                                HealthCheckServicer(self.dataplane)))
        server = NativeServer(methods, options.max_message_size, options.infer_response_compression_level,
                              self.interceptors, options.keepalive_time, options.keepalive_timeout,
                              options.max_connection_age, options.max_connection_age_grace,
                              PingPolicy(options.http2_min_recv_ping_interval_without_data / 1000,
                                         options.http2_max_ping_strikes, options.keepalive_permit_without_calls),
                              self.busy_poll)
        try:
            await server.start(self.address, self.port, self.reuse_port, tls)
        except OSError:
            raise unavailable(f"failed to start the gRPC front-end: cannot bind {self.target} "
                              "(address in use or not available)") from None
        self._native = server
        log.debug("serving gRPC (native transport%s) on %s", ", TLS" if tls is not None else "", self.target)

    async def stop(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting calls; in-flight calls get ``grace`` seconds to finish before they are cancelled."""
        if self._native is not None:
            native, self._native = self._native, None
            await native.stop(grace)
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
