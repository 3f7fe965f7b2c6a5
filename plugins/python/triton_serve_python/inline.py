"""Tensors and responses whose bytes travel inside a frame: response senders' responses and BLS calls.

These do not go through the shared-memory arenas, which belong to the EXECUTE/RESULT exchange of one batch
at a time, while senders and BLS calls run from any thread at any time. Their bytes are in the core's wire
form, as in the arenas.
"""
from __future__ import annotations

import numpy as np

from triton_serve.worker import pack_tensors, read_tensor

from .protocol import InlineTensor


def pack_array(name: str, datatype: str, array: np.ndarray) -> InlineTensor:
    """``array`` as (name, datatype, shape, bytes): little-endian elements, or length-prefixed BYTES elements."""
    [(_, _, shape, _, _)], data = pack_tensors([(name, datatype, array)])
    return name, datatype, shape, bytes(data)


def unpack_array(tensor: InlineTensor) -> np.ndarray:
    """The array a packed tensor holds (writable; BYTES as an object array of bytes)."""
    name, datatype, shape, data = tensor
    return read_tensor(bytearray(data), (name, datatype, tuple(shape), 0, len(data)))
