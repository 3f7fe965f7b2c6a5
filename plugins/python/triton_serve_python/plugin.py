"""The plugin module behind the ``python`` entry point: registers the python backend."""
from __future__ import annotations

from triton_serve.plugin import BackendRegistry, hookimpl

from .backend import PythonBackend


@hookimpl
def tserve_register_backends(registry: BackendRegistry) -> None:
    registry.add(PythonBackend)
