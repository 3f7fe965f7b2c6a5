"""Shared-memory arenas that carry tensor bytes between the server and a worker (laid out by the core's
``TensorLayout``, the form every process boundary uses)."""
from __future__ import annotations

import itertools
import os
import sys
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory


ALIGNMENT = 64  # each tensor's offset in an arena (a TensorLayout's alignment)
_counter = itertools.count()


class Arena:
    """A shared-memory segment the server creates and owns: ``<prefix><server pid>_<n>``.

    Each worker has two, one per direction, which it maps by name. One too small for a batch is replaced
    by a larger one (growing in steps of ``shm-growth-byte-size``). The worker removes the name as soon as it
    has mapped the segment (``attach``): the memory lives on in the two mappings and goes with the last of
    them, so nothing is left in /dev/shm however the processes end, SIGKILL included. Only a segment the
    worker has not mapped yet has a name, which the server's resource tracker removes if the server dies.
    """

    def __init__(self, prefix: str, size: int) -> None:
        self.name = f"{prefix}{os.getpid()}_{next(_counter)}"
        self._shm = SharedMemory(self.name, create=True, size=max(size, 1))
        self.size = self._shm.size

    @property
    def buf(self) -> memoryview:
        return mapped_bytes(self._shm)

    def release(self) -> None:
        """Remove the segment's name if the worker did not, and this mapping; the memory goes when every mapping
        is closed."""
        try:
            self._shm.unlink()
        except FileNotFoundError:  # the worker removed it: the resource tracker need not (its name has a "/")
            resource_tracker.unregister(f"/{self.name}", "shared_memory")
        close_mapping(self._shm)


def attach(name: str) -> SharedMemory:
    """Map an arena the server created and remove its name (see ``Arena``), without this process's resource
    tracker: the server owns the segment, and Python before 3.13 (no ``track=False``) would track it here."""
    if sys.version_info >= (3, 13):
        shm = SharedMemory(name, track=False)
        shm.unlink()
        return shm
    register, unregister = resource_tracker.register, resource_tracker.unregister
    resource_tracker.register = resource_tracker.unregister = lambda *args: None
    try:
        shm = SharedMemory(name)
        shm.unlink()
        return shm
    finally:
        resource_tracker.register, resource_tracker.unregister = register, unregister


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
