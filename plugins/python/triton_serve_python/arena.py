"""Shared-memory arenas that carry tensor bytes between the server and a worker, and the tensor layout in them."""
from __future__ import annotations

import itertools
import os
import sys
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from .pb_utils.dtypes import BY_NAME, decode_bytes_elements, encode_bytes_elements

# (name, datatype, shape, offset, nbytes): where one tensor sits in an arena
TensorRef = tuple[str, str, tuple[int, ...], int, int]
_ALIGNMENT = 64
_counter = itertools.count()


class Arena:
    """A shared-memory segment the server creates, owns and unlinks: ``<prefix><server pid>_<n>``.

    Each worker has two, one per direction, which it maps by name. One too small for a batch is replaced
    by a larger one (growing in steps of ``shm-growth-byte-size``).
    """

    def __init__(self, prefix: str, size: int) -> None:
        self.name = f"{prefix}{os.getpid()}_{next(_counter)}"
        self._shm = SharedMemory(self.name, create=True, size=max(size, 1))
        self.size = self._shm.size

    @property
    def buf(self) -> memoryview:
        return mapped_bytes(self._shm)

    def release(self) -> None:
        """Remove the segment's name at once; the memory goes when every mapping is closed."""
        try:
            self._shm.unlink()
        except FileNotFoundError:
            pass
        close_mapping(self._shm)


def attach(name: str) -> SharedMemory:
    """Map an arena the server created, without handing it to this process's resource tracker: the server
    owns and unlinks it, and Python before 3.13 (no ``track=False``) would unlink it when the worker exits."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name, track=False)
    register = resource_tracker.register
    resource_tracker.register = lambda *args: None
    try:
        return SharedMemory(name)
    finally:
        resource_tracker.register = register


def mapped_bytes(shm: SharedMemory) -> memoryview:
    """The bytes of a mapping; ValueError once it is closed (``SharedMemory.buf`` is None then)."""
    if shm.buf is None:
        raise ValueError(f"shared memory '{shm.name}' is closed")
    return shm.buf


def close_mapping(shm: SharedMemory) -> None:
    """Unmap, unless arrays still view the memory: then it is unmapped when they are gone."""
    try:
        shm.close()
    except BufferError:
        pass


def grown_size(current: int, needed: int, growth: int) -> int:
    """The smallest ``current + k * growth`` that holds ``needed`` bytes."""
    steps = -(-(needed - current) // max(growth, 1))
    return current + max(steps, 1) * max(growth, 1)


class TensorLayout:
    """Assigns each tensor of a batch an offset; ``size`` is the arena bytes they need; ``write`` copies them in.

    Tensors lie back to back, 64-byte aligned: numeric ones as little-endian elements, BYTES ones as
    length-prefixed elements.
    """

    def __init__(self) -> None:
        self.size = 0
        self._pending: list[tuple[int, tuple[int, ...], np.dtype, np.ndarray | bytes]] = []

    def add(self, name: str, datatype: str, array: np.ndarray) -> TensorRef:
        shape = tuple(array.shape)
        wire = BY_NAME[datatype].wire
        payload: np.ndarray | bytes
        if datatype == "BYTES":
            payload = encode_bytes_elements(array)
            nbytes = len(payload)
        else:
            payload, nbytes = array, array.size * wire.itemsize
        offset = -(-self.size // _ALIGNMENT) * _ALIGNMENT
        self.size = offset + nbytes
        self._pending.append((offset, shape, wire, payload))
        return name, datatype, shape, offset, nbytes

    def write(self, buf: memoryview) -> None:
        for offset, shape, wire, payload in self._pending:
            if isinstance(payload, bytes):
                buf[offset:offset + len(payload)] = payload
            else:
                np.ndarray(shape, wire, buffer=buf, offset=offset)[...] = payload
        self._pending.clear()


def read_tensor(buf: memoryview, ref: TensorRef, copy: bool) -> np.ndarray:
    """The tensor ``ref`` points at: a view of the arena (``copy=False``) or a copy. BYTES are always decoded."""
    _name, datatype, shape, offset, nbytes = ref
    if datatype == "BYTES":
        count = int(np.prod(shape, dtype=np.int64))
        return decode_bytes_elements(buf[offset:offset + nbytes], count).reshape(shape)
    array = np.ndarray(shape, BY_NAME[datatype].wire, buffer=buf, offset=offset)
    return array.copy() if copy else array
