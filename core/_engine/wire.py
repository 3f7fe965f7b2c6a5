"""Tensors and errors across a process boundary, in one binary form.

A tensor crosses as a descriptor, ``TensorRef`` (name, datatype, shape, offset, byte size), into one buffer
that holds the bytes of all of a message's tensors: numbers as little-endian row-major elements, BYTES in
Triton's length-prefixed form (a 4-byte little-endian length before each element), exactly as KServe's binary
extension carries them, so a receiver builds its arrays as views of the bytes it received. An error crosses as
(message, status name). The front-end channel, the Python backend's frames and arenas, and triton-serve-ray
all lay tensors out and read them back with these functions.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .datatypes import BY_NAME, from_wire_bytes, serialize_bytes
from .errors import ServerError, Status
from .inference import Parameters, Tensor

# (name, datatype, shape, offset, byte size): where one tensor's bytes sit in a message's buffer
TensorRef = tuple[str, str, tuple[int, ...], int, int]
# Bytes a tensor's elements are laid out in
Buffer = bytes | bytearray | memoryview
# A ServerError on the wire: (message, status name)
WireError = tuple[str, str]


_COPIED_THROUGH_BYTES = 4096  # an array this small is copied fastest through one bytes object (a view costs more)


class TensorLayout:
    """Gives each tensor of a message an offset (a multiple of ``alignment``) in one buffer of ``size``
    bytes; ``write`` copies them into a buffer (a shared-memory arena, say), ``tobytes`` makes one."""

    def __init__(self, alignment: int = 8) -> None:
        self.alignment = alignment
        self.size = 0
        self._pending: list[tuple[int, np.ndarray | Buffer]] = []

    def add(self, name: str, datatype: str, array: np.ndarray) -> TensorRef:
        """Lay out ``array`` (cast to ``datatype``'s element type if it is not already) and describe it."""
        shape = array.shape  # a tuple of ints
        if datatype == "BYTES":
            return self._place(name, datatype, shape, serialize_bytes(array))
        wire = BY_NAME[datatype].numpy
        return self._place(name, datatype, shape, array if array.dtype == wire else array.astype(wire))

    def add_tensor(self, tensor: Tensor) -> TensorRef:
        """Lay out a Tensor: the wire bytes it keeps as they are, else its ``data``."""
        if tensor.wire is None:
            return self.add(tensor.name, tensor.datatype, np.asarray(tensor.data).reshape(tensor.shape))
        return self._place(tensor.name, tensor.datatype, tuple(tensor.shape), tensor.wire)

    def _place(self, name: str, datatype: str, shape: tuple[int, ...], payload: np.ndarray | Buffer) -> TensorRef:
        nbytes = payload.nbytes if isinstance(payload, (np.ndarray, memoryview)) else len(payload)
        offset = -(-self.size // self.alignment) * self.alignment
        self.size = offset + nbytes
        self._pending.append((offset, payload))
        return name, datatype, shape, offset, nbytes

    def write(self, buf: memoryview | bytearray) -> None:
        """Copy the tensors added since the last write into ``buf`` at their offsets."""
        for offset, payload in self._pending:
            if not isinstance(payload, np.ndarray):
                buf[offset:offset + len(payload)] = payload
            elif payload.nbytes <= _COPIED_THROUGH_BYTES:
                buf[offset:offset + payload.nbytes] = payload.tobytes()
            elif payload.size:
                np.ndarray(payload.shape, payload.dtype, buffer=buf, offset=offset)[...] = payload
        self._pending.clear()

    def tobytes(self) -> bytearray:
        """A new buffer holding the tensors (zero bytes in the alignment gaps)."""
        buf = bytearray(self.size)
        self.write(buf)
        return buf


def pack_tensors(tensors: Iterable[tuple[str, str, np.ndarray]],
                 alignment: int = 8) -> tuple[list[TensorRef], bytearray]:
    """The descriptors of ``(name, datatype, array)`` tensors and the one buffer of their bytes."""
    layout = TensorLayout(alignment)
    refs = [layout.add(name, datatype, array) for name, datatype, array in tensors]
    return refs, layout.tobytes()


def read_tensor(buf: memoryview | bytes | bytearray, ref: TensorRef, copy: bool = False) -> np.ndarray:
    """The array ``ref`` describes in ``buf``: a view of it (read-only where ``buf`` is), or a copy with
    ``copy``. BYTES elements are always decoded into an object array of bytes. ValueError if ``buf`` holds
    fewer or more bytes for the tensor than its shape needs."""
    _name, datatype, shape, offset, nbytes = ref
    array = from_wire_bytes(datatype, shape, memoryview(buf)[offset:offset + nbytes])
    return array.copy() if copy and datatype != "BYTES" else array


def tensor_from(buf: Buffer, ref: TensorRef, parameters: Parameters | None = None, copy: bool = False) -> Tensor:
    """The Tensor ``ref`` describes in ``buf``, keeping its bytes in wire form: a view of ``buf`` (which must not
    change while the tensor lives), or with ``copy`` a copy (``buf`` is an arena its sender reuses). ValueError if
    ``buf`` holds fewer or more bytes for it than its shape needs."""
    name, datatype, shape, offset, nbytes = ref
    view = memoryview(buf)[offset:offset + nbytes]
    return Tensor.from_wire(name, datatype, shape, bytes(view) if copy else view, parameters)


def encode_error(error: ServerError) -> WireError:
    """``error`` as (message, status name), to cross a process boundary."""
    return error.message, error.status.name


def decode_error(error: WireError) -> ServerError:
    """The ServerError, with its status, that ``encode_error`` described."""
    return ServerError(error[0], Status[error[1]])
