"""A cached response as one Redis string: its content in the core's codec, with a JSON header.

Layout: ``TSRC`` (magic), format version (1 byte), header length (4 bytes, little-endian), the header (UTF-8 JSON:
the response's ``ResponseContent`` as ``encode_content`` writes it: outputs' names, datatypes, shapes, parameters and
places, the response parameters, and any field a deployment adds to the content type), then the outputs' bytes
(numbers little-endian, BYTES tensors as Triton's 4-byte length-prefixed elements). Any server sharing the Redis
decodes it; JSON rather than marshal, so that servers on other Python versions can.
"""
from __future__ import annotations

import json
import struct

from triton_serve.plugin import InferenceResponse, TensorLayout, decode_content, encode_content

MAGIC = b"TSRC"
VERSION = 2  # 1: a header of its own; 2: the content codec's
_PREAMBLE = struct.Struct("<4sBI")


class UnreadableEntry(ValueError):
    """A value in Redis that is not a response this format wrote (another writer, another version)."""


def encode(response: InferenceResponse) -> bytes:
    """``response`` (outputs and parameters; never an error response) as bytes. TypeError for what JSON or the
    wire format cannot hold (a parameter that is not a JSON value, say): such a response is not cached."""
    layout = TensorLayout()
    text = json.dumps(encode_content(response.content, layout), separators=(",", ":")).encode()
    return b"".join((_PREAMBLE.pack(MAGIC, VERSION, len(text)), text, layout.tobytes()))


def decode(value: bytes) -> InferenceResponse:
    """The response ``encode`` wrote, its outputs views of ``value``; UnreadableEntry for anything else."""
    try:
        magic, version, length = _PREAMBLE.unpack_from(value)
        if magic != MAGIC or version != VERSION:
            raise UnreadableEntry(f"not a triton-serve cache entry of format {VERSION}")
        offset = _PREAMBLE.size + length
        meta = json.loads(value[_PREAMBLE.size:offset])
        content = decode_content(InferenceResponse.content_type, meta, memoryview(value)[offset:])
        return InferenceResponse.from_content(content)
    except UnreadableEntry:
        raise
    except (struct.error, ValueError, KeyError, TypeError) as error:
        raise UnreadableEntry(f"unreadable cache entry: {error}") from None
