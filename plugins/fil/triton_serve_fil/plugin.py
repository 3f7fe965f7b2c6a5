"""The plugin module behind the ``fil`` entry point: registers the FIL backend."""
from __future__ import annotations

from triton_serve.plugin import BackendRegistry, hookimpl

from .backend import FilBackend


@hookimpl
def tserve_register_backends(registry: BackendRegistry) -> None:
    registry.add(FilBackend)
