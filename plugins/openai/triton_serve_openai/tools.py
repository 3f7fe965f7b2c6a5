"""Tool calling: the request's ``tools`` and ``tool_choice``, and reading the calls out of a model's text the way
Triton's ``llama3`` and ``mistral`` tool-call parsers do."""
from __future__ import annotations

import json
import random
import string
import uuid
from dataclasses import dataclass
from typing import Any

from .errors import bad_field

PARSERS = ("llama3", "mistral")
LLAMA3_START = "<|python_tag|>"
MISTRAL_START = "[TOOL_CALLS]"


@dataclass
class ToolRequest:
    """What a chat request asks of tools: ``mode`` is ``none``, ``auto`` (the model's text is parsed with
    ``parser``) or ``named`` (the model is constrained to ``function``'s arguments)."""

    tools: list[dict[str, Any]]
    mode: str
    parser: str | None = None
    function: dict[str, Any] | None = None

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools the chat template is given (none when the model must not call one)."""
        return self.tools if self.mode != "none" else None

    def guided_schema(self) -> dict[str, Any] | None:
        """For a named tool: the JSON schema its arguments must follow, as a ``json_schema`` response format."""
        if self.function is None:
            return None
        schema = self.function.get("parameters") or {"type": "object"}
        return {"type": "json_schema", "json_schema": {"name": self.function["name"], "schema": schema}}


def tool_request(body: dict[str, Any], parser: str | None) -> ToolRequest:
    """The request's ``tools`` and ``tool_choice``, checked; ``parser`` is ``--tool-call-parser``."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise bad_field("tool_choice", "When using `tool_choice`, `tools` must be set.")
        return ToolRequest([], "none")
    if not isinstance(tools, list) or not tools:
        raise bad_field("tools", "'tools' must be a non-empty list of tools")
    names = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise bad_field(where, f"'{where}' must be {{'type': 'function', 'function': {{...}}}}")
        function = tool["function"]
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise bad_field(f"{where}.function.name", f"'{where}.function.name' must be a non-empty string")
        if not isinstance(function.get("parameters", {}), dict):
            raise bad_field(f"{where}.function.parameters", f"'{where}.function.parameters' must be a JSON schema")
        names.append(function["name"])
    if choice in (None, "auto"):
        if parser is None:
            raise bad_field("tool_choice", '"auto" tool choice requires --tool-call-parser to be set')
        return ToolRequest(tools, "auto", parser)
    if choice == "none":
        return ToolRequest(tools, "none")
    if choice == "required":
        raise bad_field("tool_choice", "tool_choice 'required' is not supported; use 'auto' or name a function")
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise bad_field("tool_choice", f"tool_choice names function {name!r}, which is not in 'tools'")
        return ToolRequest(tools, "named", function=tools[names.index(name)]["function"])
    raise bad_field("tool_choice", "'tool_choice' must be 'none', 'auto' or "
                    "{'type': 'function', 'function': {'name': ...}}")


def parse_calls(parser: str, text: str) -> tuple[str, list[dict[str, Any]]]:
    """The reply's content and its tool calls (OpenAI's ``tool_calls`` entries); text that is not a well-formed
    call is content, as in Triton."""
    try:
        if parser == "llama3":
            return "", _llama3(text)
        return _mistral(text)
    except (ValueError, KeyError, TypeError, AttributeError):
        return text, []


def _call(call_id: str, function: dict[str, Any], arguments_key: str) -> dict[str, Any]:
    arguments = function[arguments_key]
    return {"id": call_id, "type": "function", "function": {
        "name": str(function["name"]),
        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)}}


def _llama3(text: str) -> list[dict[str, Any]]:
    """``<|python_tag|>``, or nothing, then JSON objects ``{"name", "arguments" | "parameters"}`` joined by ``;``."""
    body = text.strip()
    if body.startswith(LLAMA3_START):
        body = body[len(LLAMA3_START):]
    if not body.lstrip().startswith("{"):
        raise ValueError("not a call")
    decoder = json.JSONDecoder()
    calls, position = [], 0
    while position < len(body):
        while position < len(body) and body[position] in " \n\t;":
            position += 1
        if position == len(body):
            break
        function, position = decoder.raw_decode(body, position)
        key = "arguments" if "arguments" in function else "parameters"
        calls.append(_call(f"cmpl-{uuid.uuid4()}", function, key))
    return calls


def _mistral(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Content, then ``[TOOL_CALLS]`` and a JSON list of ``{"name", "arguments"}``."""
    content, marker, rest = text.partition(MISTRAL_START)
    if not marker:
        if not text.lstrip().startswith("["):
            raise ValueError("not a call")
        content, rest = "", text
    functions = json.loads(rest.strip())
    if not isinstance(functions, list) or not functions:
        raise ValueError("not a list of calls")
    letters = string.ascii_letters + string.digits
    return content, [_call("".join(random.choices(letters, k=9)), function, "arguments") for function in functions]

