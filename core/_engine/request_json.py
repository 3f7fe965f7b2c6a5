"""A request body's JSON, read as Triton's parser (rapidjson, default flags) reads it, with its error's prefix.

Python's ``json`` also reads ``NaN``, ``Infinity`` and ``-Infinity``, which are not JSON: here they are refused,
with rapidjson's words and byte offset (where its number parser stops: after a ``-``).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from .errors import ServerError, Status

_PARSE_FAILED = "failed to parse the request JSON buffer"
# A string (skipped) or a constant Python reads and JSON does not: the first one outside strings is the refused one.
_STRING_OR_CONSTANT = re.compile(rb'"(?:[^"\\]|\\.)*"|-?(NaN|Infinity)')


class _NotJson(ValueError):
    """A constant JSON does not have (raised from inside the decoder)."""


def _refuse(constant: str) -> Any:
    raise _NotJson(constant)


def decoder(object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> json.JSONDecoder:
    """A decoder that refuses ``NaN`` and ``Infinity`` (make it once: ``parse`` takes it)."""
    return json.JSONDecoder(object_pairs_hook=object_pairs_hook, parse_constant=_refuse)


_DECODER = decoder()
# The decoder's C scanner (its __init__ sets it; typeshed does not say so): one value from an index, with the
# decoder's settings, no whitespace skipped.
_SCAN: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]


def parse(body: bytes, status: Status = Status.INVALID_ARG, using: json.JSONDecoder = _DECODER) -> Any:
    """``body`` (UTF-8) as JSON, or a ServerError with ``status``: ``failed to parse the request JSON buffer: ...``,
    rapidjson's words for an empty document and for a constant JSON lacks (``Invalid value. at 12``), Python's
    account of any other syntax error."""
    try:
        return using.decode(body.decode("utf-8", "surrogatepass"))
    except _NotJson:
        found = next((m.start(1) for m in _STRING_OR_CONSTANT.finditer(body) if m[1]), 0)
        raise ServerError(f"{_PARSE_FAILED}: Invalid value. at {found}", status) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        if not body.strip():  # rapidjson: nothing but whitespace, which it skipped
            raise ServerError(f"{_PARSE_FAILED}: The document is empty. at {len(body)}", status) from None
        raise ServerError(f"{_PARSE_FAILED}: {error}", status) from None


def decode(text: bytes) -> Any:
    """``text`` as JSON; ValueError where ``parse`` would raise (for a hot path that reads the body in full, for
    its words, only when this fails)."""
    return _DECODER.decode(text.decode("utf-8", "surrogatepass"))


def decode_arrays(texts: list[bytes]) -> list[Any]:
    """Texts that each hold one JSON array with no bracket inside it (``[1,2]``, not ``[[1],[2]]``), read in one
    pass as the items of one array; ValueError where ``decode`` would refuse any of them. A string that runs
    past the end of its text would merge it with the next: then fewer items come than texts, also refused."""
    joined = (b"[" + b",".join(texts) + b"]").decode("utf-8", "surrogatepass")
    try:
        items, end = _SCAN(joined, 0)
    except StopIteration:  # no JSON value where one was due
        raise ValueError("not a JSON array") from None
    if end != len(joined) or len(items) != len(texts):
        raise ValueError("not one JSON array per text")
    return items
