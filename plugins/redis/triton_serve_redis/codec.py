"""A cached response as one Redis string: a small JSON header, then each output's raw little-endian bytes.

Layout: ``TSRC`` (magic), format version (1 byte), header length (4 bytes, little-endian), the header (UTF-8 JSON:
response parameters and, per output, name, datatype, shape, parameters and byte size), then the outputs' bytes in
header order (BYTES tensors as Triton's 4-byte length-prefixed elements). Any server sharing the Redis decodes it.
"""
from __future__ import annotations

import json
import struct

import numpy as np

from triton_serve.plugin import InferenceResponse, Tensor, from_wire_bytes, serialize_bytes

MAGIC = b"TSRC"
VERSION = 1
_PREAMBLE = struct.Struct("<4sBI")


class UnreadableEntry(ValueError):
    """A value in Redis that is not a response this format wrote (another writer, another version)."""


def _raw(tensor: Tensor) -> bytes:
    data = tensor.data
    if tensor.datatype == "BYTES":
        return serialize_bytes(data)
    if data.dtype.kind == "O":
        raise TypeError(f"output '{tensor.name}' of datatype {tensor.datatype} holds objects")
    return np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<")).tobytes()


def encode(response: InferenceResponse) -> bytes:
    """``response`` (outputs and parameters; never an error response) as bytes. TypeError for what JSON or the
    wire format cannot hold (a parameter that is not a JSON value, say): such a response is not cached."""
    buffers = [_raw(tensor) for tensor in response.outputs]
    header = {
        "parameters": response.parameters,
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape), "parameters": t.parameters,
                     "bytes": len(raw)} for t, raw in zip(response.outputs, buffers)],
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    return b"".join((_PREAMBLE.pack(MAGIC, VERSION, len(text)), text, *buffers))


def decode(value: bytes) -> InferenceResponse:
    """The response ``encode`` wrote; UnreadableEntry for anything else."""
    try:
        magic, version, length = _PREAMBLE.unpack_from(value)
        if magic != MAGIC or version != VERSION:
            raise UnreadableEntry(f"not a triton-serve cache entry of format {VERSION}")
        offset = _PREAMBLE.size + length
        header = json.loads(value[_PREAMBLE.size:offset])
        view = memoryview(value)
        outputs = []
        for output in header["outputs"]:
            end = offset + output["bytes"]
            if end > len(value):
                raise UnreadableEntry("the entry is shorter than its header says")
            shape = tuple(output["shape"])
            data = from_wire_bytes(output["datatype"], shape, view[offset:end])
            outputs.append(Tensor(output["name"], output["datatype"], shape, data, output["parameters"]))
            offset = end
        return InferenceResponse(outputs, header["parameters"])
    except UnreadableEntry:
        raise
    except (struct.error, ValueError, KeyError, TypeError) as error:
        raise UnreadableEntry(f"unreadable cache entry: {error}") from None
