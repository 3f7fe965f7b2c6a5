"""Opt-in alias: ``import triton_serve_pytriton.as_pytriton`` before a PyTriton script's own imports
makes ``pytriton.*`` name this package's modules for the rest of the process, so the script runs
with that one line added. It changes nothing on disk and refuses to hide an installed ``pytriton``
that is already imported."""
from __future__ import annotations

import importlib
import sys

MODULES = ("triton", "decorators", "model_config", "exceptions", "client", "proxy", "proxy.types")


def install() -> None:
    """Map ``pytriton`` and its modules to this package's (idempotent)."""
    current = sys.modules.get("pytriton")
    if current is not None and not getattr(current, "__name__", "").startswith("triton_serve_pytriton"):
        raise ImportError("pytriton (nvidia-pytriton) is already imported; the alias would hide it")
    sys.modules["pytriton"] = importlib.import_module("triton_serve_pytriton")
    for name in MODULES:
        sys.modules[f"pytriton.{name}"] = importlib.import_module(f"triton_serve_pytriton.{name}")


install()
