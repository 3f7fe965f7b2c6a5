"""Triton's OpenAI front-end flags (``--openai-port``, ``--openai-restricted-api``, ``--tool-call-parser``): the
port that serves the ``/v1/`` plugin app alone, the header check Triton's front-end runs on its API groups, and
what the ``/v1/`` app is told."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ServerError, Status
from ..seam import DataPlaneAPI
from .http.app import Receive, Scope, Send
from .http_apps import HttpAppRegistry
from .restricted import AsgiApp, Restrictions

OPENAI_PREFIX = "/v1/"  # the plugin prefix --openai-port serves
# vLLM's paths outside /v1 that the OpenAI plugin serves too (on --openai-port as on the HTTP port)
OPENAI_ROOT_PREFIXES = ("/tokenize/", "/detokenize/")
SCRAPE_TIMEOUT_S = 30.0  # /metrics on --openai-port: how long the metrics port may take to answer
DEFAULT_OPENAI_PORT = 9000  # Triton's --openai-port default
TOOL_CALL_PARSERS = ("llama3", "mistral")  # Triton's --tool-call-parser choices
DEFAULT_MAX_TOOL_CALL_PARSE_BYTES = 128 * 1024  # Triton's --max-tool-call-parse-bytes default

# Triton's OpenAI front-end groups: each (method, path prefix) a group covers, in Triton's order
# (python/openai/openai_frontend/frontend/fastapi/middleware/api_restriction.py).
OPENAI_API_GROUPS: dict[str, tuple[tuple[str, str], ...]] = {
    "inference": (("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/embeddings")),
    "model-repository": (("GET", "/v1/models"), ("POST", "/v1/models/")),
    "metrics": (("GET", "/metrics"),),
    "health": (("GET", "/health/ready"),),
}


@dataclass
class OpenAIOptions:
    """The OpenAI flags as plain values (a front-end process receives them as JSON)."""

    port: int | None = None  # None: /v1 is served on the HTTP port alone
    restricted_api: Restrictions = field(default_factory=dict)  # group -> (header, value)
    tool_call_parser: str | None = None  # --tool-call-parser: how "auto" tool choice reads a model's tool calls
    # --max-tool-call-parse-bytes: a streamed reply read for tool calls is cut (finish_reason "length") past it
    max_tool_call_parse_bytes: int = DEFAULT_MAX_TOOL_CALL_PARSE_BYTES
    # what the server tells the app (``told_by_server``), not flags of their own:
    explicit_model_control: bool = False  # --model-control-mode explicit: /v1/models/{model}/load and /unload work
    metrics_endpoint: tuple[str, int] | None = None  # where the metrics port answers (None: --allow-metrics false)


def told_by_server(options: OpenAIOptions, *, model_control_mode: str, metrics_address: str | None,
                   metrics_port: int) -> OpenAIOptions:
    """``options`` with what the server's other flags say: whether models load explicitly, and where its metrics
    port answers (``metrics_address`` None: metrics are off; a wildcard address is reached on loopback)."""
    endpoint = None
    if metrics_address is not None:
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(metrics_address, metrics_address)
        endpoint = (host, metrics_port)
    return dataclasses.replace(options, explicit_model_control=model_control_mode == "explicit",
                               metrics_endpoint=endpoint)


def add_openai_flags(group: argparse._ArgumentGroup) -> None:
    """``--openai-port [port]``, the repeatable ``--openai-restricted-api <APIs> <key> <value>``,
    ``--tool-call-parser`` and ``--max-tool-call-parse-bytes``."""
    group.add_argument("--openai-port", type=int, nargs="?", const=DEFAULT_OPENAI_PORT, default=None,
                       help="also serve OpenAI's /v1 API (plugin triton-serve-openai) on this port, with no /v2 "
                            f"(alone: {DEFAULT_OPENAI_PORT}); /v1 stays on the HTTP port too")
    group.add_argument("--openai-restricted-api", nargs=3, action="append", default=[],
                       metavar=("APIs", "Restricted Key", "Restricted Value"),
                       help="<API_1>,<API_2>,... <header> <value>: requests to those API groups ("
                            + ", ".join(OPENAI_API_GROUPS) + ") must carry the header with that value (repeatable)")
    group.add_argument("--tool-call-parser", choices=TOOL_CALL_PARSERS, default=None,
                       help="read tool calls from the model's text the way Llama 3 or Mistral models write them "
                            "(needed for tool_choice 'auto')")
    group.add_argument("--max-tool-call-parse-bytes", type=int, default=DEFAULT_MAX_TOOL_CALL_PARSE_BYTES,
                       help="the longest streamed reply (characters) read for tool calls: past it the stream ends "
                            "with finish_reason 'length' and the generation is cancelled (default "
                            f"{DEFAULT_MAX_TOOL_CALL_PARSE_BYTES})")


def parse_openai_restrictions(items: Sequence[Sequence[str]]) -> Restrictions:
    """Every ``--openai-restricted-api`` triple, checked as Triton's front-end checks them."""
    restrictions: Restrictions = {}
    for apis, key, value in items:
        for api in apis.split(","):
            if api not in OPENAI_API_GROUPS:
                raise ServerError(f"--openai-restricted-api: Unknown API '{api}'. Available APIs: "
                                  f"{list(OPENAI_API_GROUPS)}")
            if api in restrictions:
                raise ServerError(f"--openai-restricted-api: restricted api '{api}' can not be specified in "
                                  "multiple config groups")
            restrictions[api] = (key, value)
    return restrictions


def openai_options_from_args(args: argparse.Namespace) -> OpenAIOptions:
    port = args.openai_port
    if port is not None:
        if not 0 <= port <= 65535:
            raise ServerError(f"--openai-port must be a port number, got {port}")
        for proto in ("http", "grpc", "metrics"):
            if getattr(args, f"allow_{proto}") and getattr(args, f"{proto}_port") == port:
                raise ServerError(f"--openai-port {port} is the --{proto}-port too: give each listener its own port")
    if args.max_tool_call_parse_bytes < 1:
        raise ServerError(f"--max-tool-call-parse-bytes must be at least 1, got {args.max_tool_call_parse_bytes}")
    restrictions = parse_openai_restrictions(args.openai_restricted_api)
    if restrictions:  # the groups and their headers, never the values
        logging.getLogger("triton_serve").info(
            "OpenAI API restrictions enabled: %s", {group: header for group, (header, _value) in restrictions.items()})
    return OpenAIOptions(port, restrictions, args.tool_call_parser, args.max_tool_call_parse_bytes)


def require_openai_plugin(options: OpenAIOptions, apps: HttpAppRegistry) -> None:
    """Fail when ``--openai-port`` is given and no installed plugin serves the ``/v1/`` app."""
    if options.port is not None and apps.get(OPENAI_PREFIX) is None:
        raise ServerError("--openai-port needs the OpenAI front-end plugin (pip install triton-serve-openai)",
                          Status.INVALID_ARG)


def restrict_openai(app: AsgiApp, restrictions: Restrictions) -> AsgiApp:
    """``app`` behind Triton's OpenAI check: a request whose method and path start one of a restricted group's
    endpoints, without the group's header value, gets 401 and OpenAI's error shape. ``app`` itself when nothing
    is restricted."""
    if not restrictions:
        return app
    # (method, path prefix, header as ASGI spells it, expected value, the refusal's body)
    checks = [(method, prefix, header.lower().encode(), value.encode(), json.dumps({"error": {
        "message": f"This API is restricted, expecting header '{header}' with valid value",
        "type": "authentication_error", "code": "invalid_auth"}}).encode())
        for group, (header, value) in restrictions.items() for method, prefix in OPENAI_API_GROUPS[group]]

    async def restricted_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for method, prefix, header, expected, refusal in checks:
                if scope["method"] == method and scope["path"].startswith(prefix):
                    given = next((value for name, value in scope["headers"] if name == header), None)
                    if given != expected:
                        while (await receive()).get("more_body", False):
                            pass  # read the refused body: hypercorn closes a connection that leaves it unread
                        await send({"type": "http.response.start", "status": 401, "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(refusal)).encode())]})
                        await send({"type": "http.response.body", "body": refusal})
                        return
                    break
        await app(scope, receive, send)
    return restricted_app


def openai_port_app(mounts: dict[str, AsgiApp], api: DataPlaneAPI, options: OpenAIOptions) -> AsgiApp:
    """What ``--openai-port`` serves: the OpenAI plugin's paths (``/v1``, ``/tokenize``, ``/detokenize``: the
    ``mounts`` registered for them, restricted as they are on the HTTP port), Triton's ``GET /health/ready`` and
    ``GET /metrics`` (behind the ``health`` and ``metrics`` groups of ``--openai-restricted-api``), and OpenAI's
    404 shape for every other path."""
    served = {prefix: mounts[prefix] for prefix in (OPENAI_PREFIX, *OPENAI_ROOT_PREFIXES) if prefix in mounts}
    observability = restrict_openai(_observability_app(api, options), options.restricted_api)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await served[OPENAI_PREFIX](scope, receive, send)
            return
        path = scope["path"]
        for prefix, mounted in served.items():
            if path == prefix[:-1] or path.startswith(prefix):
                await mounted(scope, receive, send)
                return
        if path in ("/health/ready", "/metrics"):
            await observability(scope, receive, send)
            return
        await _send_error(send, 404, "Not Found")
    return app


def _observability_app(api: DataPlaneAPI, options: OpenAIOptions) -> AsgiApp:
    """``GET /health/ready`` (200 when the server is ready for inference, else 400 with Triton's message) and
    ``GET /metrics`` (the metrics port's Prometheus text)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "GET":
            await _send_error(send, 405, f"Method Not Allowed ({scope['method']} {scope['path']})")
        elif scope["path"] == "/health/ready":
            if await api.server_ready():
                await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
                await send({"type": "http.response.body", "body": b""})
            else:
                await _send_error(send, 400, "Attached inference engine is not ready for inference requests.")
        elif options.metrics_endpoint is None:
            await _send_error(send, 503, "Metrics are disabled (--allow-metrics false)")
        else:
            try:
                content_type, body = await _scrape(*options.metrics_endpoint)
            except (OSError, asyncio.TimeoutError, ValueError) as error:
                await _send_error(send, 503, f"the metrics port did not answer: {error or type(error).__name__}")
                return
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
    return app


async def _scrape(host: str, port: int) -> tuple[bytes, bytes]:
    """The content type and body of ``GET /metrics`` on the metrics port (HTTP/1.0: the answer ends with the
    connection)."""
    async def fetch() -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"GET /metrics HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
            await writer.drain()
            return await reader.read()
        finally:
            writer.close()
    answer = await asyncio.wait_for(fetch(), SCRAPE_TIMEOUT_S)
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if len(lines[0].split()) < 2 or lines[0].split()[1] != b"200":
        raise ValueError(f"the metrics port answered {lines[0].decode(errors='replace')!r}")
    content_type = next((line.partition(b":")[2].strip() for line in lines[1:]
                         if line.lower().startswith(b"content-type:")), b"text/plain; version=0.0.4")
    return content_type, body


async def _send_error(send: Send, status: int, message: str) -> None:
    kind = {401: "authentication_error", 500: "internal_error", 503: "service_unavailable"}.get(
        status, "invalid_request_error")
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
