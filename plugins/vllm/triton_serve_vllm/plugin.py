"""Registers the vllm backend."""
from __future__ import annotations

from triton_serve.plugin import BackendRegistry, hookimpl

from .backend import VllmBackend


@hookimpl
def tserve_register_backends(registry: BackendRegistry) -> None:
    registry.add(VllmBackend)
