"""The ``triton-serve`` command: Triton's server flags, plus ``triton-serve plugins``."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys

from .errors import ServerError
from .frontend_pool import default_process_count
from .frontends import run_on_fast_loop
from .http.serving import HTTP_SERVERS
from .grpc_frontend.server import COMPRESSION_LEVELS, GrpcOptions
from .pluginhost import PluginHost
from .ratelimit import parse_resource_flag
from .server import Server, ServerOptions


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _keyed_options(text: str) -> tuple[str, dict[str, str]]:
    """``name,key=value[,key=value]`` as used by --backend-config and --cache-config."""
    name, _, rest = text.partition(",")
    options = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected <name>,<key>=<value>, got '{text}'")
        options[key] = value
    return name, options


def _frontend_count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"expected a number of processes (0 or more), got '{text}'")
    return count


def _rate_limit_resource(value: str) -> tuple[tuple[str, int | None], int]:
    try:
        return parse_resource_flag(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triton-serve", description="Serve a Triton model repository over KServe v2 HTTP and gRPC. "
        "Run 'triton-serve plugins' to list installed plugins.")
    flag = parser.add_argument
    flag("--model-repository", "--model-store", dest="model_repositories", action="append", default=[],
         help="model repository path (repeatable); default: the example repository shipped with triton-serve")
    for proto, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        flag(f"--{proto}-port", type=int, default=port)
        flag(f"--{proto}-address", default="0.0.0.0")
        flag(f"--allow-{proto}", type=_bool, nargs="?", const=True, default=True)
    flag("--http-server", choices=list(HTTP_SERVERS), default="uvicorn",
         help="the HTTP/1.1 server: uvicorn with httptools (default, fastest) or hypercorn (also serves HTTP/2)")
    flag("--frontend-processes", type=_frontend_count, default=default_process_count(),
         help="processes that accept HTTP and gRPC on the server's ports and forward to the process that owns "
              "the models; 0 serves both protocols in that process (default: one per core on 4 cores or more, "
              f"else 0; here {default_process_count()})")
    _add_grpc_flags(parser)
    flag("--model-control-mode", choices=["none", "explicit"], default="none")
    flag("--load-model", dest="load_models", action="append", default=[],
         help="model to load at start-up in explicit mode ('*' for all; repeatable)")
    flag("--exit-on-error", type=_bool, nargs="?", const=True, default=False,
         help="exit if a model fails to load at start-up (default false: serve the others)")
    flag("--strict-readiness", type=_bool, nargs="?", const=True, default=True)
    flag("--strict-model-config", type=_bool, nargs="?", const=True, default=False)
    flag("--disable-auto-complete-config", type=_bool, nargs="?", const=True, default=False)
    flag("--model-config-name", default="")
    flag("--http-max-input-size", type=int, default=1 << 26)
    flag("--backend-config", action="append", default=[], type=_keyed_options,
         help="<backend>,<key>=<value> (repeatable)")
    flag("--cache-config", type=_keyed_options, default=None, help="<cache>,<key>=<value>, e.g. local,size=1048576")
    flag("--rate-limit", choices=["off", "execution_count"], default="off",
         help="execution_count: instances run only while they hold their rate_limiter resources")
    flag("--rate-limit-resource", dest="rate_limit_resources", action="append", default=[],
         type=_rate_limit_resource, help="<name>:<count>[:<device>] (repeatable)")
    flag("--log-verbose", type=int, default=0)
    flag("--plugin", dest="plugins", action="append", default=[],
         help="'no:NAME' blocks plugin NAME (repeatable)")
    return parser


def _add_grpc_flags(parser: argparse.ArgumentParser) -> None:
    """Triton's gRPC flags beyond port and address (times in milliseconds)."""
    flag = parser.add_argument
    defaults = GrpcOptions()
    for name in ("use-ssl", "use-ssl-mutual", "keepalive-permit-without-calls"):
        flag(f"--grpc-{name}", type=_bool, nargs="?", const=True, default=getattr(defaults, name.replace("-", "_")))
    for name in ("server-cert", "server-key", "root-cert"):
        flag(f"--grpc-{name}", default="", help="PEM file")
    flag("--grpc-infer-response-compression-level", choices=list(COMPRESSION_LEVELS), default="none")
    for name in ("keepalive-time", "keepalive-timeout", "http2-max-pings-without-data",
                 "http2-min-recv-ping-interval-without-data", "http2-max-ping-strikes", "max-connection-age",
                 "max-connection-age-grace"):
        flag(f"--grpc-{name}", type=int, default=getattr(defaults, name.replace("-", "_")))


def _grpc_options(args: argparse.Namespace) -> GrpcOptions:
    """Each GrpcOptions field from its --grpc-<field> flag (max_message_size has no flag)."""
    return GrpcOptions(**{f.name: getattr(args, f"grpc_{f.name}") for f in dataclasses.fields(GrpcOptions)
                          if f.name != "max_message_size"})


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    blocked = []
    for item in args.plugins:
        if not item.startswith("no:"):
            raise ServerError(f"--plugin expects 'no:NAME' to block a plugin, got '{item}'")
        blocked.append(item[3:])
    backend_config: dict[str, dict[str, str]] = {}
    for name, options in args.backend_config:
        backend_config.setdefault(name, {}).update(options)
    return ServerOptions(
        model_repositories=args.model_repositories,
        http_address=args.http_address, http_port=args.http_port, allow_http=args.allow_http,
        http_server=args.http_server, frontend_processes=args.frontend_processes,
        grpc_address=args.grpc_address, grpc_port=args.grpc_port, allow_grpc=args.allow_grpc,
        grpc_options=_grpc_options(args),
        metrics_address=args.metrics_address, metrics_port=args.metrics_port, allow_metrics=args.allow_metrics,
        exit_on_error=args.exit_on_error, strict_readiness=args.strict_readiness,
        strict_model_config=args.strict_model_config,
        disable_auto_complete_config=args.disable_auto_complete_config or args.strict_model_config,
        model_control_mode=args.model_control_mode, load_models=args.load_models,
        model_config_name=args.model_config_name, http_max_input_size=args.http_max_input_size,
        backend_config=backend_config, cache_config=args.cache_config, blocked_plugins=blocked,
        rate_limit=args.rate_limit, rate_limit_resources=dict(args.rate_limit_resources))


def list_plugins(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="triton-serve plugins", description="List installed plugins.")
    parser.add_argument("--plugin", dest="plugins", action="append", default=[])
    args = parser.parse_args(argv)
    host = PluginHost(blocked=[p[3:] for p in args.plugins if p.startswith("no:")])
    for info in host.describe():
        version = f" {info.version}" if info.version else ""
        print(f"{info.name}  ({info.distribution}{version})")
        print(f"    hooks: {', '.join(info.hooks) or '-'}")
    for name in host.backends.names():
        reason = host.backends.instance(name).unavailable_reason()
        state = f"unavailable: {reason}" if reason else "available"
        print(f"backend {name}: {state} (from plugin '{host.backends.owner(name)}')")
    return 0


async def _run(options: ServerOptions) -> None:
    server = Server(options)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, server.request_stop)
    await server.start()
    log = logging.getLogger("triton_serve")
    if options.allow_http:
        log.info("serving HTTP on %s:%d", options.http_address, options.http_port)
    if options.allow_grpc:
        log.info("serving gRPC on %s:%d", options.grpc_address, options.grpc_port)
    await server.wait_stopped()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["plugins"]:
            return list_plugins(argv[1:])
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=logging.DEBUG if args.log_verbose else logging.INFO,
                            format="%(asctime)s %(levelname).1s %(name)s] %(message)s")
        run_on_fast_loop(_run(options_from_args(args)))
    except ServerError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 1
    return 0
