"""The plugin module behind the ``openvino`` entry point: registers the openvino backend."""
from __future__ import annotations

from triton_serve.plugin import BackendRegistry, hookimpl

from .backend import OpenVinoBackend


@hookimpl
def tserve_register_backends(registry: BackendRegistry) -> None:
    registry.add(OpenVinoBackend)
