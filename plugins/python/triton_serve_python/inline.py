"""Tensors and responses whose bytes travel inside a frame: response senders' responses and BLS calls.

These do not go through the shared-memory arenas, which belong to the EXECUTE/RESULT exchange of one batch
at a time, while senders and BLS calls run from any thread at any time.
"""
from __future__ import annotations

import numpy as np

from .pb_utils.dtypes import BY_NAME, decode_bytes_elements, encode_bytes_elements
from .protocol import InlineTensor


def pack_array(name: str, datatype: str, array: np.ndarray) -> InlineTensor:
    """``array`` as (name, datatype, shape, bytes): little-endian elements, or length-prefixed BYTES elements."""
    shape = tuple(int(dim) for dim in array.shape)
    if datatype == "BYTES":
        return name, datatype, shape, encode_bytes_elements(array)
    return name, datatype, shape, np.ascontiguousarray(array, BY_NAME[datatype].wire).tobytes()


def unpack_array(tensor: InlineTensor) -> np.ndarray:
    """The array a packed tensor holds (writable; BYTES as an object array of bytes)."""
    _name, datatype, shape, data = tensor
    if datatype == "BYTES":
        count = int(np.prod(shape, dtype=np.int64))
        return decode_bytes_elements(data, count).reshape(shape)
    return np.frombuffer(bytearray(data), BY_NAME[datatype].wire).reshape(shape)
