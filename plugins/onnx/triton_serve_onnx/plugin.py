"""The plugin module behind the ``onnxruntime`` entry point: registers the ONNX Runtime backend."""
from __future__ import annotations

from triton_serve.plugin import BackendRegistry, hookimpl

from .backend import OnnxRuntimeBackend


@hookimpl
def tserve_register_backends(registry: BackendRegistry) -> None:
    registry.add(OnnxRuntimeBackend)
