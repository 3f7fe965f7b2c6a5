"""Header forwarding (``--http-header-forward-pattern``, ``--grpc-header-forward-pattern``): the request
headers or metadata whose name matches become inference request parameters, as in Triton."""
from __future__ import annotations

import re
from collections.abc import Iterable

from ..errors import ServerError

# The request-parameter names Triton keeps for itself (besides every name starting with "triton_"): from
# Triton 2.69 a header or metadata entry that would be forwarded under one of them fails the request.
RESERVED_PARAMETER_KEYS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                     "headers", "binary_data_output"})

# An RE2 flag group that sets or clears flags until its enclosing group ends, such as "(?-i)".
_BARE_FLAGS = re.compile(r"\(\?([imsU]+(?:-[imsU]*)?|-[imsU]+)\)")


def forward_pattern_regex(pattern: str, flag: str) -> re.Pattern[str]:
    """``pattern`` compiled as Triton compiles it: RE2 with ``(?i)`` in front, so names match in any case
    unless the pattern says ``(?-i)``. Raises ServerError naming ``flag`` when it does not compile."""
    try:
        return re.compile(_scoped_flags("(?i)" + pattern))
    except re.error as error:
        raise ServerError(f"{flag}: invalid regular expression '{pattern}': {error.msg}") from None


def _scoped_flags(pattern: str) -> str:
    """RE2's bare flag groups as Python's scoped ones: Python accepts ``(?i)`` only at the very start, so
    ``a(?-i)b|c`` (flags last to the end of the enclosing group, across ``|``) becomes ``a(?-i:b)|(?-i:c)``."""
    out: list[str] = []
    opened: list[list[str]] = [[]]  # per enclosing group, the flag groups opened in it so far
    i = 0
    while i < len(pattern):
        char = pattern[i]
        step = 1
        if char == "\\":
            step = 2
        elif char == "[":
            step = _class_end(pattern, i) - i
        elif char == "(":
            flags = _BARE_FLAGS.match(pattern, i)
            if flags is not None:
                out.append(f"(?{flags[1]}:")
                opened[-1].append(flags[1])
                i = flags.end()
                continue
            opened.append([])
        elif char == ")" and len(opened) > 1:
            out.append(")" * len(opened.pop()))
        elif char == "|" and opened[-1]:
            out.append(")" * len(opened[-1]) + "|" + "".join(f"(?{flags}:" for flags in opened[-1]))
            i += 1
            continue
        out.append(pattern[i:i + step])
        i += step
    out.append(")" * len(opened[0]))
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    """The index just past the character class that opens at ``start`` (a ``]`` first in it is literal)."""
    i = start + 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


class HeaderForwarder:
    """Picks the headers (HTTP) or metadata (gRPC) whose name the pattern finds (RE2's partial match),
    to add to an inference request's parameters. Only inference requests get them, as in Triton."""

    def __init__(self, pattern: str, flag: str) -> None:
        self._search = forward_pattern_regex(pattern, flag).search

    def matching(self, headers: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
        """Name -> value of each matching header (binary gRPC metadata as latin-1 text; the last of a
        repeated name wins). A matching name that Triton reserves is an INVALID_ARG error, as in Triton 2.69."""
        forwarded = {name: value if isinstance(value, str) else value.decode("latin-1")
                     for name, value in headers if self._search(name)}
        for name in forwarded:
            if name in RESERVED_PARAMETER_KEYS or name.startswith("triton_"):
                raise ServerError(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
        return forwarded


def header_forwarder(pattern: str | None, flag: str) -> HeaderForwarder | None:
    """The forwarder for a ``flag`` value; None when the flag is not given. An empty pattern forwards every
    header, as Triton's does (its pattern is then "(?i)")."""
    return None if pattern is None else HeaderForwarder(pattern, flag)
