"""Engines shared by the instances of a model on one GPU: loaded by the first, freed after the last."""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

E = TypeVar("E")

# (plan path, device, file mtime in ns, file size): a plan replaced on disk is a new engine.
EngineKey = tuple[str, int, int, int]


@dataclass
class EngineLease(Generic[E]):
    """One instance's hold on a shared engine; ``release()`` it once, when the instance unloads."""

    engine: E
    key: EngineKey
    owner: SharedEngines[E]
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.owner._release(self.key)


class SharedEngines(Generic[E]):
    """Loads each (plan file, GPU) once with ``load(path, device)`` and counts its users.

    Loads run one at a time under a lock: TensorRT's engine deserialization is not thread-safe.
    """

    def __init__(self, load: Callable[[Path, int], E], free: Callable[[E], None] = lambda engine: None) -> None:
        self._load = load
        self._free = free
        self._lock = threading.Lock()
        self._engines: dict[EngineKey, tuple[E, int]] = {}

    def acquire(self, plan: Path, device: int) -> EngineLease[E]:
        stat = plan.stat()
        key: EngineKey = (str(plan.resolve()), device, stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if key in self._engines:
                engine, users = self._engines[key]
            else:
                engine, users = self._load(plan, device), 0
            self._engines[key] = (engine, users + 1)
        return EngineLease(engine, key, self)

    def users(self, plan: Path, device: int) -> int:
        """How many leases on (plan, device) are held now, whatever version of the file they loaded."""
        path = str(plan.resolve())
        with self._lock:
            return sum(users for key, (_, users) in self._engines.items() if key[0] == path and key[1] == device)

    def _release(self, key: EngineKey) -> None:
        with self._lock:
            engine, users = self._engines[key]
            if users > 1:
                self._engines[key] = (engine, users - 1)
                return
            del self._engines[key]
        self._free(engine)
