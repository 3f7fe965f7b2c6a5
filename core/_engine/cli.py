"""The ``triton-serve`` command: Triton's server flags, ``triton-serve plugins`` and plugins' subcommands."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys
from collections.abc import Callable

from .frontend.busy_poll import DEFAULT_MICROSECONDS
from .errors import ServerError, Status
from .frontend_pool import default_process_count
from .frontend.frontends import run_on_fast_loop
from .frontend.http.serving import HTTP_SERVERS
from .log_settings import FORMATS, LogSettings, apply_log_settings
from .metrics import MetricsConfig, parse_metrics_config
from .options import describe_options
from .frontend.grpc.server import COMPRESSION_LEVELS, GrpcOptions
from .frontend.header_forwarding import forward_pattern_regex
from .frontend.openai_listener import add_openai_flags, openai_options_from_args
from .platform_flags import add_platform_flags, platform_options_from_args
from .pluginhost import PluginHost
from .ratelimit import parse_resource_flag
from .frontend.restricted import CATEGORIES, GRPC_HEADER_PREFIX, parse_restrictions
from .server import Server, ServerOptions
from .trace_settings import add_trace_flags, trace_config_from_args, warn_deprecated_trace_flags


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


def _one_cache(flags: list[tuple[str, dict[str, str]]]) -> tuple[str, dict[str, str]] | None:
    """Every --cache-config flag's keys merged, as Triton gathers them per cache; they must name one cache."""
    if not flags:
        return None
    names = list(dict.fromkeys(name for name, _ in flags))
    if len(names) > 1:
        raise ServerError(f"--cache-config names caches {', '.join(repr(n) for n in names)}: one cache at a time")
    merged: dict[str, str] = {}
    for _, options in flags:
        merged.update(options)
    return names[0], merged


def _backend_config(text: str) -> tuple[str, dict[str, str]]:
    """``<backend>,<setting>=<value>``, or Triton's global ``<setting>=<value>`` (backend name ""), read as
    Triton reads them: one setting per flag, whose value is everything after its ``=``."""
    name, comma, rest = text.partition(",")
    if not comma:
        name, rest = "", text
    elif not name:
        raise argparse.ArgumentTypeError("No backend specified. --backend-config option format is <backend name>,"
                                         f"<setting>=<value> or <setting>=<value>. Got {text}")
    setting, equals, value = rest.partition("=")
    if not (equals and setting and value):
        raise argparse.ArgumentTypeError(f"--backend-config option format is '<backend name>,<setting>=<value>'. "
                                         f"Got {text}")
    return name, {setting: value}


def _whole_number(low: int, high: int | None, message: str) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (None: no limit), else ``message`` (``{text}``
    is the value given)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(message.format(text=text))
        return value
    return parse


_frontend_count = _whole_number(0, None, "expected a number of processes (0 or more), got '{text}'")
_poll_secs = _whole_number(0, None, "expected a number of seconds (0 or more), got '{text}'")
_microseconds = _whole_number(0, 1_000_000, "expected a number of microseconds from 0 to 1000000, got '{text}'")


def _rate_limit_resource(value: str) -> tuple[tuple[str, int | None], int]:
    try:
        return parse_resource_flag(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# tritonserver 2.51 flags that mean nothing here, or are not built yet: accepted, each with one warning
# naming it, so a Triton launch command line starts triton-serve unchanged. (group, flag, metavar, why)
IGNORED_FLAGS: list[tuple[str, str, str, str]] = [
    ("Model Repository", "--model-load-thread-count", "<integer>", "models load concurrently on one event loop"),
    ("Model Repository", "--model-load-retry-count", "<integer>", "a failed load is not retried"),
    ("Model Repository", "--enable-peer-access", "<boolean>", "no CUDA peer access is set up"),
    ("HTTP", "--http-thread-count", "<integer>", "use --frontend-processes to serve on more cores"),
    ("GRPC", "--grpc-infer-allocation-pool-size", "<integer>", "no response pool to size"),
    ("GRPC", "--grpc-infer-thread-count", "<integer>",  # Triton 2.57
     "every gRPC call runs on the event loop; use --frontend-processes to serve on more cores"),
    ("GRPC", "--grpc-max-response-pool-size", "<integer>", "no response pool to size"),  # Triton 2.56
    ("Sagemaker", "--sagemaker-thread-count", "<integer>", "the SageMaker listener runs on the event loop"),
    ("Vertex", "--vertex-ai-thread-count", "<integer>", "the Vertex AI listener runs on the event loop"),
    ("Backend", "--backend-directory", "<string>", "backends are Python packages found through entry points"),
    ("Repository Agent", "--repoagent-directory", "<string>",
     "repository agents are Python packages found through entry points"),
    ("Response Cache", "--cache-directory", "<string>", "caches are Python packages found through entry points"),
    ("Memory and devices", "--pinned-memory-pool-byte-size", "<integer>", "no pinned memory pool is kept"),
    ("Memory and devices", "--cuda-memory-pool-byte-size", "<integer>:<integer>", "no CUDA memory pool is kept"),
    ("Memory and devices", "--cuda-virtual-address-size", "<integer>:<integer>", "no CUDA memory pool is kept"),
    ("Memory and devices", "--min-supported-compute-capability", "<float>", "GPUs are used as the backends find them"),
    ("Memory and devices", "--buffer-manager-thread-count", "<integer>", "no buffer manager threads"),
    ("Memory and devices", "--host-policy", "<string>,<string>=<string>", "host policies are not supported"),
    ("Memory and devices", "--model-load-gpu-limit", "<device_id>:<fraction>", "GPU memory is not limited"),
]


def _checked_only(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type that refuses what ``check`` refuses and keeps the value as given (an ignored flag's)."""
    def parse(text: str) -> str:
        check(text)
        return text
    return parse


# --grpc-infer-thread-count and --grpc-max-response-pool-size, refused as Triton refuses them
_grpc_infer_threads = _checked_only(_whole_number(2, 128, "invalid argument for --grpc_infer_thread_count. Must be "
                                                          "in the range 2 to 128."))
_grpc_response_pool = _checked_only(_whole_number(1, None, "Error: --grpc-max-response-pool-size must be greater "
                                                           "than 0."))


# The accepted-with-a-warning flags whose value is still checked as tritonserver checks it.
_IGNORED_TYPES = {"--grpc-infer-thread-count": _grpc_infer_threads,
                  "--grpc-max-response-pool-size": _grpc_response_pool}
# Flags only triton-serve has.
OWN_GROUP = "triton-serve"
# The help's groups, in tritonserver --help's order, then ours.
GROUPS = ("Server", "Logging", "Model Repository", "HTTP", "GRPC", "Sagemaker", "Vertex", "Metrics", "Tracing",
          "Backend", "Repository Agent", "Response Cache", "Rate Limiter", "Memory and devices", "DEPRECATED",
          OWN_GROUP)


def build_parser() -> argparse.ArgumentParser:
    """Every tritonserver 2.51 flag, grouped as ``tritonserver --help`` groups them, plus triton-serve's own."""
    parser = argparse.ArgumentParser(
        prog="triton-serve", description="Serve a Triton model repository over KServe v2 HTTP and gRPC. "
        "Run 'triton-serve plugins' to list installed plugins and the subcommands they add "
        "('triton-serve <command> --help').")
    groups = {title: parser.add_argument_group(title) for title in GROUPS}
    group = groups.__getitem__

    server = group("Server").add_argument
    server("--id", default="triton", help="the server's name in its metadata (default triton)")
    server("--exit-timeout-secs", type=int, default=30,
           help="seconds a graceful stop waits for in-flight requests (default 30)")
    _add_log_flags(group("Logging"))
    repo = group("Model Repository").add_argument
    repo("--model-repository", "--model-store", dest="model_repositories", action="append", default=[],
         help="model repository path (repeatable); default: the example repository shipped with triton-serve")
    repo("--exit-on-error", type=_bool, nargs="?", const=True, default=False,
         help="exit if a model fails to load at start-up (default false: serve the others)")
    repo("--disable-auto-complete-config", type=_bool, nargs="?", const=True, default=False)
    repo("--strict-readiness", type=_bool, nargs="?", const=True, default=True)
    repo("--model-control-mode", choices=["none", "poll", "explicit"], default="none",
         help="none: load every model at start-up; poll: also follow the repositories' changes; "
              "explicit: load what --load-model and the load API ask for")
    repo("--repository-poll-secs", type=_poll_secs, default=15, metavar="<integer>",
         help="poll mode: seconds between polls of the model repositories (default 15; 0: no polling)")
    repo("--load-model", dest="load_models", action="append", default=[],
         help="model to load at start-up in explicit mode ('*' for all; repeatable)")
    repo("--model-config-name", default="")
    repo("--model-namespacing", type=_bool, nargs="?", const=True, default=False, metavar="<boolean>",
         help="let several model repositories hold models of one name (a request naming such a model alone "
              "is ambiguous; an ensemble uses its own repository's)")
    for proto, title, port in (("http", "HTTP", 8000), ("grpc", "GRPC", 8001), ("metrics", "Metrics", 8002)):
        add = group(title).add_argument
        add(f"--allow-{proto}", type=_bool, nargs="?", const=True, default=True)
        add(f"--{proto}-address", default="0.0.0.0")
        add(f"--{proto}-port", type=int, default=port)
        if proto != "metrics":
            add(f"--reuse-{proto}-port", type=_bool, nargs="?", const=True, default=False,
                help="let other processes bind the same port (SO_REUSEPORT)")
    _add_grpc_flags(group("GRPC"))
    add_platform_flags(parser, group("Sagemaker"), group("Vertex"), _bool)
    add_openai_flags(group(OWN_GROUP))
    _add_access_flags(group("HTTP"), group("GRPC"))
    group("Memory and devices").add_argument(
        "--allow-client-shm", type=_bool, nargs="?", const=True, default=True, metavar="<boolean>",
        help="let clients register and unregister system and CUDA shared-memory regions (default true, as "
             "Triton 2.51; Triton 2.69 turned it off by default)")
    metrics = group("Metrics").add_argument
    metrics("--allow-gpu-metrics", type=_bool, nargs="?", const=True, default=True,
            help="GPU metrics through nvidia-ml-py, where it is installed and a GPU is present (default true)")
    metrics("--allow-cpu-metrics", type=_bool, nargs="?", const=True, default=True,
            help="nv_cpu_* metrics from /proc (default true)")
    metrics("--metrics-interval-ms", type=float, default=2000.0,
            help="how often CPU and GPU metrics are polled, in milliseconds (default 2000)")
    metrics("--metrics-config", action="append", default=[], metavar="<string>=<string>",
            help="counter_latencies, summary_latencies, summary_quantiles=<q>:<error>,..., histogram_latencies, "
                 "histogram_buckets=<us>,... (repeatable; see docs/metrics.md)")
    group("Backend").add_argument(
        "--backend-config", action="append", default=[], type=_backend_config,
        help="<backend>,<setting>=<value> for one backend, or <setting>=<value> for every backend (repeatable)")
    cache = group("Response Cache").add_argument
    cache("--cache-config", type=_keyed_options, action="append", default=[],
          help="<cache>,<key>=<value>, e.g. local,size=1048576; repeat it for more keys, as Triton")
    limiter = group("Rate Limiter").add_argument
    limiter("--rate-limit", choices=["off", "execution_count"], default="off",
            help="execution_count: instances run only while they hold their rate_limiter resources")
    limiter("--rate-limit-resource", dest="rate_limit_resources", action="append", default=[],
            type=_rate_limit_resource, help="<name>:<count>[:<device>] (repeatable)")
    add_trace_flags(group("Tracing"), group("DEPRECATED"))
    deprecated = group("DEPRECATED").add_argument
    deprecated("--strict-model-config", type=_bool, nargs="?", const=True, default=False)
    deprecated("--response-cache-byte-size", type=int, default=None,
               help="the same as --cache-config=local,size=<value>")
    for title, name, metavar, why in IGNORED_FLAGS:
        group(title).add_argument(name, metavar=metavar, default=None, type=_IGNORED_TYPES.get(name, str),
                                  help=f"accepted, no effect: {why}")
    own = group(OWN_GROUP).add_argument
    own("--http-server", choices=list(HTTP_SERVERS), default="uvicorn",
        help="the HTTP/1.1 server: uvicorn with httptools (default, fastest) or hypercorn (also serves HTTP/2)")
    own("--frontend-processes", type=_frontend_count, default=default_process_count(),
        help="processes that accept HTTP and gRPC on the server's ports and forward to the process that owns "
             "the models; 0 serves both protocols in that process (default: one per core on 4 cores or more, "
             f"else 0; here {default_process_count()})")
    own("--http-max-input-size", type=int, default=1 << 26)
    own("--busy-poll-microseconds", type=_microseconds, default=DEFAULT_MICROSECONDS,
        help="after answering a request, the most µs the process that answered keeps polling for the client's next "
             "one instead of sleeping; it polls for four times the usual wait for one (0: never; the python "
             "backend's workers have a setting of their own)")
    own("--plugin", dest="plugins", action="append", default=[], help="'no:NAME' blocks plugin NAME (repeatable)")
    return parser


def warn_ignored_flags(args: argparse.Namespace) -> None:
    """One warning line for each given flag that triton-serve accepts but does not act on."""
    log = logging.getLogger("triton_serve")
    for _title, name, _metavar, why in IGNORED_FLAGS:
        if getattr(args, name[2:].replace("-", "_")) is not None:
            log.warning("%s is accepted for tritonserver compatibility but has no effect: %s", name, why)


def _verbose_level(text: str) -> int:
    """--log-verbose: a level, or true (1) / false (0), as tritonserver reads it; below 0 is 0."""
    value = text.strip().lower()
    if value in ("true", "false"):
        return int(value == "true")
    try:
        level = int(value)
    except ValueError:
        level = None
    if level is None or level >= 2**31:
        raise argparse.ArgumentTypeError(f"expected a verbose level (an int32), got '{text}'")
    return max(0, level)


def _add_log_flags(group: argparse._ArgumentGroup) -> None:
    """Triton's logging flags; GET/POST /v2/logging reads and changes them while the server runs."""
    flag = group.add_argument
    flag("--log-verbose", type=_verbose_level, default=0, metavar="<integer>",
         help="verbose logging level: 0 (default) none, 1 or more our DEBUG lines")
    for level in ("info", "warning", "error"):
        flag(f"--log-{level}", type=_bool, nargs="?", const=True, default=True, metavar="<boolean>",
             help=f"write {level} lines (default true)")
    flag("--log-format", choices=list(FORMATS), default="default",
         help="default: 'I1123 02:30:00.123456 <pid> file.py:12] ...'; ISO8601: '2026-11-23T02:30:00Z I <pid> ...'")
    flag("--log-file", default="", metavar="<string>", help="append the log to this file (default: standard error)")


def log_settings_from_args(args: argparse.Namespace) -> LogSettings:
    """The log settings the --log-* flags ask for."""
    return LogSettings(log_file=args.log_file, log_info=args.log_info, log_warning=args.log_warning,
                       log_error=args.log_error, log_verbose_level=args.log_verbose, log_format=args.log_format)


def _add_grpc_flags(group: argparse._ArgumentGroup) -> None:
    """Triton's gRPC flags beyond port and address (times in milliseconds)."""
    flag = group.add_argument
    defaults = GrpcOptions()
    for name in ("use-ssl", "use-ssl-mutual", "keepalive-permit-without-calls"):
        flag(f"--grpc-{name}", type=_bool, nargs="?", const=True, default=getattr(defaults, name.replace("-", "_")))
    for name in ("server-cert", "server-key", "root-cert"):
        flag(f"--grpc-{name}", default="", help="PEM file")
    flag("--grpc-infer-response-compression-level", choices=list(COMPRESSION_LEVELS), default="none")
    flag("--grpc-transport", choices=["native", "grpcio"], default=defaults.transport,
         help="native (triton-serve's own HTTP/2 on the event loop, with or without TLS; the default) or grpcio "
              "(grpc.aio)")
    for name in ("keepalive-time", "keepalive-timeout", "http2-max-pings-without-data",
                 "http2-min-recv-ping-interval-without-data", "http2-max-ping-strikes", "max-connection-age",
                 "max-connection-age-grace"):
        flag(f"--grpc-{name}", type=int, default=getattr(defaults, name.replace("-", "_")))


def _add_access_flags(http: argparse._ArgumentGroup, grpc: argparse._ArgumentGroup) -> None:
    """Restricted APIs and header forwarding, per protocol (docs/access-control.md)."""
    categories = ", ".join(CATEGORIES)
    http.add_argument("--http-header-forward-pattern", metavar="<string>", default=None,
                      help="request headers whose name matches this regular expression (any case unless it "
                           "starts with (?-i)) are added to inference request parameters")
    http.add_argument("--http-restricted-api", metavar="<string>:<string>=<string>", action="append", default=[],
                      help=f"<apis>:<key>=<value>: these APIs answer 403 unless the request has header <key> "
                           f"set to <value> (repeatable). APIs: {categories}")
    grpc.add_argument("--grpc-header-forward-pattern", metavar="<string>", default=None,
                      help="request metadata whose name matches this regular expression (any case unless it "
                           "starts with (?-i)) is added to inference request parameters")
    grpc.add_argument("--grpc-restricted-protocol", metavar="<string>:<string>=<string>", action="append",
                      default=[], help=f"<protocols>:<key>=<value>: these RPCs fail with UNAVAILABLE unless the "
                                       f"call has metadata {GRPC_HEADER_PREFIX}<key> set to <value> (repeatable). "
                                       f"Protocols: {categories}")


def _forward_pattern(pattern: str | None, flag: str) -> str | None:
    """The pattern, once it is known to compile (a bad one is a start-up error naming the flag)."""
    if pattern is not None:
        forward_pattern_regex(pattern, flag)
    return pattern


def _grpc_options(args: argparse.Namespace) -> GrpcOptions:
    """Each GrpcOptions field from its --grpc-<field> flag (max_message_size has no flag)."""
    return GrpcOptions(**{f.name: getattr(args, f"grpc_{f.name}") for f in dataclasses.fields(GrpcOptions)
                          if f.name != "max_message_size"})


class UsageError(ServerError):
    """A command line tritonserver refuses as it parses it: ``main`` prints the message alone, as tritonserver
    prints its ParseException, and exits 1."""


# tritonserver's texts (command_line_parser.cc; core's model_repository_manager.cc, through main.cc's
# "error: creating server: <code> - <message>").
LOAD_MODEL_NEEDS_EXPLICIT = "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
WILDCARD_NOT_ALONE = ("creating server: Invalid argument - Wildcard model name '*' must be the ONLY startup model if "
                      "specified at all.")


def check_startup_models(args: argparse.Namespace) -> None:
    """``--load-model`` as tritonserver takes it: only with ``--model-control-mode=explicit``, and ``*`` only alone."""
    if args.load_models and args.model_control_mode != "explicit":
        raise UsageError(LOAD_MODEL_NEEDS_EXPLICIT)
    if "*" in args.load_models and len(set(args.load_models)) > 1:
        raise ServerError(WILDCARD_NOT_ALONE, Status.INVALID_ARG)


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    check_startup_models(args)
    blocked = []
    for item in args.plugins:
        if not item.startswith("no:"):
            raise ServerError(f"--plugin expects 'no:NAME' to block a plugin, got '{item}'")
        blocked.append(item[3:])
    backend_config: dict[str, dict[str, str]] = {}
    for name, options in args.backend_config:
        backend_config.setdefault(name, {}).update(options)
    cache_config = _one_cache(args.cache_config)
    if cache_config is None and args.response_cache_byte_size:
        cache_config = ("local", {"size": str(args.response_cache_byte_size)})
    return ServerOptions(
        model_repositories=args.model_repositories,
        http_address=args.http_address, http_port=args.http_port, allow_http=args.allow_http,
        http_server=args.http_server, frontend_processes=args.frontend_processes,
        busy_poll_microseconds=args.busy_poll_microseconds,
        grpc_address=args.grpc_address, grpc_port=args.grpc_port, allow_grpc=args.allow_grpc,
        grpc_options=_grpc_options(args),
        metrics_address=args.metrics_address, metrics_port=args.metrics_port, allow_metrics=args.allow_metrics,
        allow_cpu_metrics=args.allow_cpu_metrics, allow_gpu_metrics=args.allow_gpu_metrics,
        metrics_interval_ms=_metrics_interval(args.metrics_interval_ms),
        metrics_config=_metrics_config(args.metrics_config),
        exit_on_error=args.exit_on_error, strict_readiness=args.strict_readiness,
        strict_model_config=args.strict_model_config,
        disable_auto_complete_config=args.disable_auto_complete_config or args.strict_model_config,
        model_control_mode=args.model_control_mode, load_models=args.load_models,
        repository_poll_secs=args.repository_poll_secs,
        model_config_name=args.model_config_name, http_max_input_size=args.http_max_input_size,
        backend_config=backend_config, cache_config=cache_config, blocked_plugins=blocked,
        server_id=args.id, exit_timeout_secs=args.exit_timeout_secs, reuse_http_port=args.reuse_http_port,
        reuse_grpc_port=args.reuse_grpc_port, log_settings=log_settings_from_args(args),
        http_restricted_api=parse_restrictions("--http-restricted-api", args.http_restricted_api, kind="api"),
        grpc_restricted_protocol=parse_restrictions("--grpc-restricted-protocol", args.grpc_restricted_protocol,
                                                    kind="protocol", header_prefix=GRPC_HEADER_PREFIX),
        http_header_forward_pattern=_forward_pattern(args.http_header_forward_pattern,
                                                     "--http-header-forward-pattern"),
        grpc_header_forward_pattern=_forward_pattern(args.grpc_header_forward_pattern,
                                                     "--grpc-header-forward-pattern"),
        allow_client_shm=args.allow_client_shm, model_namespacing=args.model_namespacing,
        trace_config=trace_config_from_args(args),
        rate_limit=args.rate_limit, rate_limit_resources=dict(args.rate_limit_resources),
        platforms=platform_options_from_args(args), openai=openai_options_from_args(args))


def _metrics_interval(value: float) -> float:
    if not value > 0:
        raise ServerError(f"--metrics-interval-ms must be positive, got {value:g}")
    return value


def _metrics_config(items: list[str]) -> MetricsConfig:
    config = parse_metrics_config(items)
    for setting in config.unknown:
        logging.getLogger("triton_serve").warning("--metrics-config: unknown setting '%s' is ignored", setting)
    return config


def list_plugins(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="triton-serve plugins", description="List installed plugins.")
    parser.add_argument("--plugin", dest="plugins", action="append", default=[])
    args = parser.parse_args(argv)
    host = PluginHost(blocked=[p[3:] for p in args.plugins if p.startswith("no:")])
    for info in host.describe():
        version = f" {info.version}" if info.version else ""
        print(f"{info.name}  ({info.distribution}{version})")
        print(f"    {info.note}" if info.note else f"    hooks: {', '.join(info.hooks) or '-'}")
    for name in host.backends.names():
        reason = host.backends.instance(name).unavailable_reason()
        state = f"unavailable: {reason}" if reason else "available"
        print(f"backend {name}: {state} (from plugin '{host.backends.owner(name)}')")
        backend = host.backends.get(name)
        assert backend is not None
        for line in describe_options(backend):
            print(f"    {line}")
    for name in host.commands.names():
        help_text = f": {host.commands.help[name]}" if host.commands.help[name] else ""
        print(f"command triton-serve {name}{help_text} (from plugin '{host.commands.owner(name)}')")
    return 0


def run_plugin_command(argv: list[str]) -> int:
    """``triton-serve <command> ...`` for a command a plugin registered (tserve_register_commands)."""
    commands = PluginHost().commands
    command = commands.get(argv[0])
    if command is None:
        known = ", ".join(["plugins", *commands.names()])
        raise ServerError(f"unknown command '{argv[0]}' (commands: {known}; server flags start with '--', "
                          "see 'triton-serve --help')")
    return command(argv[1:])


async def _run(options: ServerOptions) -> None:
    server = Server(options)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, server.request_stop)
    await server.start()
    log = logging.getLogger("triton_serve")
    if options.allow_http:
        log.info("serving HTTP on %s:%d", options.http_address, options.http_port)
    if options.allow_grpc:  # once, however many front-end processes serve it (each says more at verbose level)
        log.info("serving gRPC on %s:%d", options.grpc_address, options.grpc_port)
    await server.wait_stopped()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["plugins"]:
            return list_plugins(argv[1:])
        if argv and not argv[0].startswith("-"):
            return run_plugin_command(argv)
        args = build_parser().parse_args(argv)
        apply_log_settings(log_settings_from_args(args))
        warn_ignored_flags(args)
        warn_deprecated_trace_flags(args)
        run_on_fast_loop(_run(options_from_args(args)))
    except UsageError as error:
        print(error.message, file=sys.stderr)
        return 1
    except ServerError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 1
    return 0
