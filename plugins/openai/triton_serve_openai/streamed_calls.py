"""Tool calls read out of a streamed reply as it grows, sent as OpenAI's deltas (content, then each call's
arguments as they are written)."""
from __future__ import annotations

import json
import random
import re
import string
import uuid
from dataclasses import dataclass
from typing import Any

from .tools import LLAMA3_START, MISTRAL_START, parse_calls

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NESTING = re.compile(r'["{}\[\]]')
_LITERAL_END = re.compile(r'[,}\]\s]')
_ARGUMENT_KEYS = ("arguments", "parameters")


def _string_end(text: str, position: int) -> int | None:
    """Where the JSON string starting at ``position`` ends (None: it is not complete yet)."""
    match = _STRING.match(text, position)
    return None if match is None else match.end()


def _value_end(text: str, position: int) -> int | None:
    """Where the JSON value starting at ``position`` ends (None: it is not complete yet)."""
    first = text[position]
    if first == '"':
        return _string_end(text, position)
    if first not in "{[":
        match = _LITERAL_END.search(text, position)
        return None if match is None else match.start()
    depth = 0
    while True:
        match = _NESTING.search(text, position)
        if match is None:
            return None
        if match.group() == '"':
            end = _string_end(text, match.start())
            if end is None:
                return None
            position = end
            continue
        depth += 1 if match.group() in "{[" else -1
        position = match.end()
        if depth == 0:
            return position


def _skip(text: str, position: int, characters: str) -> int:
    while position < len(text) and text[position] in characters:
        position += 1
    return position


@dataclass
class _PartialCall:
    """What an object of a reply says of its call so far: its name once whole, its arguments' text as written."""

    name: str | None = None
    arguments: str | None = None  # None: no arguments key yet
    quoted: bool = False  # the arguments are a JSON string (sent once whole, decoded)
    end: int | None = None  # where the object ends (None: not yet)


def _partial_call(text: str, position: int) -> _PartialCall:
    """The call in the JSON object that starts at ``position`` (a ``{``), as far as ``text`` goes."""
    call = _PartialCall()
    position += 1
    while True:
        position = _skip(text, position, " \n\t\r,")
        if position >= len(text):
            return call
        if text[position] == "}":
            call.end = position + 1
            return call
        key_end = _string_end(text, position) if text[position] == '"' else None
        if key_end is None:
            return call
        key = json.loads(text[position:key_end])
        position = _skip(text, key_end, " \n\t\r")
        if position >= len(text) or text[position] != ":":
            return call
        position = _skip(text, position + 1, " \n\t\r")
        if position >= len(text):
            return call
        value_end = _value_end(text, position)
        if key == "name" and text[position] == '"':
            if value_end is None:
                return call
            call.name = json.loads(text[position:value_end])
        elif key in _ARGUMENT_KEYS and call.arguments is None:
            call.quoted = text[position] == '"'
            if call.quoted:
                call.arguments = "" if value_end is None else json.loads(text[position:value_end])
            else:
                call.arguments = text[position:value_end] if value_end is not None else text[position:]
        if value_end is None:
            return call
        position = value_end


@dataclass
class _SentCall:
    id: str
    name: str
    arguments: int = 0  # characters of arguments sent


class CallStream:
    """Reads tool calls out of a streamed reply as it grows (``--tool-call-parser``'s formats), and turns each
    piece into OpenAI's deltas: content as soon as it cannot be a call, each call's arguments as they are
    written. A call's first delta carries its ``id``, ``type`` and ``function.name`` (with the arguments so
    far, however many tokens the piece held); later deltas carry its ``index``, ``type`` and the new
    arguments. A reply that ends without a well-formed call is content, as in a whole answer."""

    def __init__(self, parser: str) -> None:
        self.parser = parser
        self.text = ""
        self.mode = "undecided"  # then "content", "calls", or "held" (decided whole at the end)
        self.content_end = 0  # calls: where the content before them ends
        self.position = 0  # calls: where the next object (or the list's opening) is read from
        self.opened = parser != "mistral"  # whether the calls' list was opened (mistral writes a JSON list)
        self.sent_content = 0
        self.calls: list[_SentCall] = []
        self.completed = 0  # calls whose object ended

    def feed(self, piece: str) -> list[dict[str, Any]]:
        """The deltas ``piece`` makes (none while the reply may still be calls)."""
        self.text += piece
        if self.mode == "undecided" or (self.mode == "content" and self.parser == "mistral"):
            self._decide()
        if self.mode == "content":
            return self._content(self._held_marker())
        if self.mode == "calls":
            return self._content(self.content_end) + self._call_deltas()
        return []

    def finish(self) -> list[dict[str, Any]]:
        """The last deltas, once the reply is whole."""
        if self.calls:
            return []
        content, calls = parse_calls(self.parser, self.text)
        if not calls:
            return self._content(len(self.text))
        delta: dict[str, Any] = {"tool_calls": [{"index": index, **call} for index, call in enumerate(calls)]}
        if content[self.sent_content:]:
            delta["content"] = content[self.sent_content:]
        self.calls = [_SentCall(call["id"], call["function"]["name"]) for call in calls]
        return [delta]

    def _content(self, end: int) -> list[dict[str, Any]]:
        if end <= self.sent_content:
            return []
        text, self.sent_content = self.text[self.sent_content:end], end
        return [{"content": text}]

    def _held_marker(self) -> int:
        """Where content may be sent up to: mistral holds back what may begin ``[TOOL_CALLS]``."""
        if self.parser == "mistral":
            for hold in range(min(len(MISTRAL_START) - 1, len(self.text)), 0, -1):
                if MISTRAL_START.startswith(self.text[-hold:]):
                    return len(self.text) - hold
        return len(self.text)

    def _decide(self) -> None:
        stripped = self.text.lstrip()
        if self.parser == "llama3":
            if not stripped or LLAMA3_START.startswith(stripped):
                return
            start = len(self.text) - len(stripped)
            if stripped.startswith(LLAMA3_START):
                start += len(LLAMA3_START)
            start = _skip(self.text, start, " \n\t\r")
            if start < len(self.text):
                self.mode, self.position = ("calls", start) if self.text[start] == "{" else ("content", 0)
            return
        marker = self.text.find(MISTRAL_START, max(0, self.sent_content - len(MISTRAL_START)))
        if marker >= 0:
            self.mode, self.content_end, self.position = "calls", marker, marker + len(MISTRAL_START)
        elif self.mode == "undecided" and stripped.startswith("["):
            self.mode, self.position = "calls", len(self.text) - len(stripped)
        elif stripped and not MISTRAL_START.startswith(stripped):
            self.mode = "content"

    def _call_deltas(self) -> list[dict[str, Any]]:
        text, deltas = self.text, list[dict[str, Any]]()
        separators = " \n\t\r;" if self.parser == "llama3" else " \n\t\r,"
        if not self.opened:
            self.position = _skip(text, self.position, " \n\t\r")
            if self.position >= len(text):
                return []
            if text[self.position] != "[":
                return self._not_calls()
            self.opened, self.position = True, self.position + 1
        while True:
            self.position = _skip(text, self.position, separators)
            if self.position >= len(text) or text[self.position] == "]":
                return deltas
            if text[self.position] != "{":  # no call: after calls it is ignored, as the whole parsers do
                return deltas if self.calls else self._not_calls()
            call = _partial_call(text, self.position)
            announced = self.completed < len(self.calls)
            if announced or (call.name is not None and call.arguments is not None):
                deltas.extend(self._call_delta(self.completed, call))
                announced = True
            if call.end is None:
                return deltas
            if announced:
                self.completed += 1
            elif not self.calls:
                return self._not_calls()
            self.position = call.end

    def _call_delta(self, index: int, call: _PartialCall) -> list[dict[str, Any]]:
        arguments = call.arguments or ""
        if call.quoted and call.end is None:
            arguments = ""  # arguments written as a JSON string are sent once whole, decoded
        if index == len(self.calls):
            sent = _SentCall(self._new_id(), call.name or "", len(arguments))
            self.calls.append(sent)
            return [{"tool_calls": [{"index": index, "id": sent.id, "type": "function",
                                     "function": {"name": sent.name, "arguments": arguments}}]}]
        sent = self.calls[index]
        if len(arguments) <= sent.arguments:
            return []
        new, sent.arguments = arguments[sent.arguments:], len(arguments)
        return [{"tool_calls": [{"index": index, "type": "function", "function": {"arguments": new}}]}]

    def _not_calls(self) -> list[dict[str, Any]]:
        """What looked like calls is none so far: the whole reply decides it at its end."""
        self.mode = "held"
        return []

    def _new_id(self) -> str:
        if self.parser == "mistral":
            return "".join(random.choices(string.ascii_letters + string.digits, k=9))
        return f"cmpl-{uuid.uuid4()}"
