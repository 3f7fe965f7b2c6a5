"""The plugin module behind the ``tensorrt`` entry point: registers the TensorRT backend."""
from __future__ import annotations

from triton_serve.plugin import BackendRegistry, hookimpl

from .backend import TensorRTBackend


@hookimpl
def tserve_register_backends(registry: BackendRegistry) -> None:
    registry.add(TensorRTBackend)
