"""triton-serve on Ray Serve: a deployment per model of a repository, behind a front door (triton-serve's HTTP and
gRPC front-ends) that sends each request straight to a model replica over the binary channel."""
from __future__ import annotations

from .app import build_app, deploy
from .options import AppArgs

__all__ = ["AppArgs", "build_app", "deploy"]
