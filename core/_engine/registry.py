"""Registries that registration hooks fill: backends, schedulers and response caches by name."""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from .backend import Backend
from .caching import ResponseCache
from .errors import ServerError, Status
from .options import backend_options, declared_options
from .repo_agents import AgentFactory
from .scheduling import ModelContext, Scheduler

T = TypeVar("T")

SchedulerFactory = Callable[[ModelContext], Scheduler]
CacheFactory = Callable[[Mapping[str, str]], ResponseCache]
CommandMain = Callable[[list[str]], int]

# Which distribution to install for a backend, platform or scheduler that no plugin provides.
KNOWN_PACKAGES: dict[str, str] = {
    "python": "triton-serve-python",
    "onnxruntime": "triton-serve-onnx[cpu]",  # or [gpu]: the extra picks the ONNX Runtime build
    "onnxruntime_onnx": "triton-serve-onnx[cpu]",
    "pytorch": "triton-serve-torch",
    "pytorch_libtorch": "triton-serve-torch",
    "openvino": "triton-serve-openvino",
    "fil": "triton-serve-fil",
    "transformers": "triton-serve-transformers",
    "tensorrt": "triton-serve-tensorrt",
    "tensorrt_plan": "triton-serve-tensorrt",
    "dynamic_batching": "triton-serve-batching",
    "sequence_batching": "triton-serve-batching",
    "ensemble": "triton-serve-ensemble",
    "ensemble_scheduling": "triton-serve-ensemble",
}

# Subcommands the command line itself runs; no plugin may register these names.
BUILTIN_COMMANDS = ("plugins",)

SCHEDULING_KINDS = ("default", "dynamic_batching", "sequence_batching", "ensemble_scheduling")


def install_hint(name: str) -> str:
    package = KNOWN_PACKAGES.get(name)
    if not package:
        return "install a plugin that provides it"
    return f"install it with 'pip install {package}' (wheels built as docs/installing.md shows)"


class Registry(Generic[T]):
    """Name -> item. A name registered twice is an error naming both plugins, except that a
    built-in plugin quietly yields to an installed plugin that registered the name first."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._owners: dict[str, str] = {}
        self.current_plugin = "<direct>"
        self.current_is_builtin = False

    def add(self, name: str, item: T) -> None:
        if name in self._items:
            if self.current_is_builtin:
                return
            raise ServerError(
                f"{self.kind} '{name}' is registered by both plugin '{self._owners[name]}' "
                f"and plugin '{self.current_plugin}'", Status.ALREADY_EXISTS)
        self._items[name] = item
        self._owners[name] = self.current_plugin

    def get(self, name: str) -> T | None:
        return self._items.get(name)

    def owner(self, name: str) -> str:
        return self._owners[name]

    def names(self) -> list[str]:
        return sorted(self._items)


class BackendRegistry(Registry[type[Backend]]):
    """Backends by name, and Triton platform names (``onnxruntime_onnx``) mapped to backend names."""

    def __init__(self) -> None:
        super().__init__("backend")
        self.platforms: dict[str, str] = {}
        self._instances: dict[str, Backend] = {}
        self._creating = threading.Lock()
        self.options: dict[str, dict[str, str]] = {}

    def add(self, backend: type[Backend]) -> None:  # type: ignore[override]
        """Register a Backend subclass under its ``name`` and ``platforms``; a TypeError names an
        ``Options`` or ``Parameters`` field that is not a supported ``option()``."""
        for declaration in (backend.Options, backend.Parameters):
            declared_options(declaration)  # fails at start-up, not at the first load
        before = self.get(backend.name)
        super().add(backend.name, backend)
        if self.get(backend.name) is backend and before is None:
            for platform in backend.platforms:
                self.platforms.setdefault(platform, backend.name)

    def backend_name_for(self, backend: str, platform: str) -> str:
        """The backend that serves a config's ``backend``/``platform`` pair, or a clear error."""
        if backend:
            if self.get(backend) is None:
                raise ServerError(f"no installed plugin provides backend '{backend}'; {install_hint(backend)}",
                                  Status.UNAVAILABLE)
            return backend
        if platform in self.platforms:
            return self.platforms[platform]
        raise ServerError(f"no installed plugin provides platform '{platform}'; {install_hint(platform)}",
                          Status.UNAVAILABLE)

    def instance(self, name: str) -> Backend:
        """The server's one object for backend ``name``, created on first use with its parsed options (a
        ServerError names a bad one). Loads call this from worker threads at once: one creates it."""
        with self._creating:
            if name not in self._instances:
                backend_cls = self.get(name)
                assert backend_cls is not None
                # Triton's global --backend-config=<setting>=<value> (name "") applies to every backend.
                settings = {**self.options.get("", {}), **self.options.get(name, {})}
                self._instances[name] = backend_cls(backend_options(backend_cls, settings))
            return self._instances[name]


class SchedulerRegistry(Registry[SchedulerFactory]):
    """Scheduler factories by scheduling kind (see SCHEDULING_KINDS)."""

    def __init__(self) -> None:
        super().__init__("scheduler")

    def add(self, kind: str, factory: SchedulerFactory) -> None:
        """Register the factory of schedulers for a scheduling kind (``dynamic``, ``sequence``, ...)."""
        if kind not in SCHEDULING_KINDS:
            raise ValueError(f"unknown scheduling kind '{kind}'; expected one of {', '.join(SCHEDULING_KINDS)}")
        super().add(kind, factory)


class CacheRegistry(Registry[CacheFactory]):
    """Response cache factories by the name ``--cache-config`` uses (``local``...)."""

    def __init__(self) -> None:
        super().__init__("response cache")


class RepositoryAgentRegistry(Registry[AgentFactory]):
    """Repository agent factories by the name a config's ``model_repository_agents`` uses (``checksum``...)."""

    def __init__(self) -> None:
        super().__init__("repository agent")


class CommandRegistry(Registry[CommandMain]):
    """``triton-serve <command>`` subcommands that plugins add, by name, each with a one-line help."""

    def __init__(self) -> None:
        super().__init__("command")
        self.help: dict[str, str] = {}

    def add(self, name: str, main: CommandMain, help: str = "") -> None:
        """Register ``main(argv) -> exit status`` as ``triton-serve <name>``; a name that is not one word
        of letters, digits, ``-`` or ``_`` (or starts with ``-``) is a ValueError."""
        if not name or name.startswith("-") or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"a command name is one word of letters, digits, '-' and '_', got '{name}'")
        if name in BUILTIN_COMMANDS:
            raise ServerError(f"command '{name}' is built into triton-serve; plugin '{self.current_plugin}' "
                              "cannot register it", Status.ALREADY_EXISTS)
        before = self.get(name)
        super().add(name, main)
        if before is None:
            self.help[name] = help

