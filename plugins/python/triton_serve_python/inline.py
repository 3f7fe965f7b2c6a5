"""Requests and responses whose tensors travel inside a frame: response senders' responses and BLS calls.

These do not go through the shared-memory arenas, which belong to the EXECUTE/RESULT exchange of one batch at a
time, while senders and BLS calls run from any thread at any time. They cross as their content in the core's codec
(``encode_content``), as EXECUTE's requests and RESULT's responses do: the content's metadata and the bytes of its
tensors.
"""
from __future__ import annotations

from typing import TypeVar

from triton_serve.worker import RequestContent, ResponseContent, decode_content, pack_content

from .protocol import InlineContent

_Content = TypeVar("_Content", RequestContent, ResponseContent)


def pack(content: RequestContent | ResponseContent) -> InlineContent:
    """``content`` as a frame carries it: (its metadata, its tensors' bytes)."""
    return pack_content(content)


def unpack(content_type: type[_Content], packed: InlineContent, writable: bool = False) -> _Content:
    """The content ``pack`` packed; its tensors are views of the frame's bytes (read-only), or of a writable copy."""
    meta, data = packed
    return decode_content(content_type, meta, bytearray(data) if writable else data)
