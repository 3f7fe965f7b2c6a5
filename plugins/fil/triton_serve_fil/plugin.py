"""The plugin module behind the ``fil`` entry point: registers the FIL backend."""
from __future__ import annotations

from triton_serve.hookspecs import hookimpl
from triton_serve.registry import BackendRegistry

from .backend import FilBackend


@hookimpl
def tserve_register_backends(registry: BackendRegistry) -> None:
    registry.add(FilBackend)
