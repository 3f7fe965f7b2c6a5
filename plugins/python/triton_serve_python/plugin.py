"""The plugin module behind the ``python`` entry point: registers the python backend."""
from __future__ import annotations

from triton_serve.hookspecs import hookimpl
from triton_serve.registry import BackendRegistry

from .backend import PythonBackend


@hookimpl
def tserve_register_backends(registry: BackendRegistry) -> None:
    registry.add(PythonBackend)
