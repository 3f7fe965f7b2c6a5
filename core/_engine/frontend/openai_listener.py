"""Triton's OpenAI front-end flags (``--openai-port``, ``--openai-restricted-api``, ``--tool-call-parser``): the
port that serves the ``/v1/`` plugin app alone, the header check Triton's front-end runs on its API groups, and
what the ``/v1/`` app is told."""
from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ServerError
from .http.app import Receive, Scope, Send
from .restricted import AsgiApp, Restrictions

OPENAI_PREFIX = "/v1/"  # the plugin prefix --openai-port serves
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


def openai_port_app(v1_app: AsgiApp) -> AsgiApp:
    """What ``--openai-port`` serves: the ``/v1`` app, and OpenAI's 404 shape for every other path."""
    missing = json.dumps({"error": {"message": "Not Found", "type": "invalid_request_error", "param": None,
                                    "code": None}}).encode()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/v1" or scope["path"].startswith(OPENAI_PREFIX):
            await v1_app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 404, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(missing)).encode())]})
        await send({"type": "http.response.body", "body": missing})
    return app
