"""Parts of the Python-backend API that come in later releases: each raises a clear UNSUPPORTED error."""
from __future__ import annotations

from .errors import unsupported


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    raise unsupported("load_model from inside a model")


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    raise unsupported("unload_model from inside a model")


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    raise unsupported("is_model_ready from inside a model")
