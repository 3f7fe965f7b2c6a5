"""triton-serve on Ray Serve: a deployment per model of a repository, behind one KServe v2 HTTP ingress."""
from __future__ import annotations

from .app import build_app, deploy
from .options import AppArgs

__all__ = ["AppArgs", "build_app", "deploy"]
