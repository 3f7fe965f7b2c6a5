"""The plugin module behind the ``pytorch`` entry point: registers the PyTorch backend."""
from __future__ import annotations

from triton_serve.plugin import BackendRegistry, hookimpl

from .backend import PyTorchBackend


@hookimpl
def tserve_register_backends(registry: BackendRegistry) -> None:
    registry.add(PyTorchBackend)
