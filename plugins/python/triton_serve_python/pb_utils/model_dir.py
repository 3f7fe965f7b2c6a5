"""``get_model_dir()``: the directory of the model being run, as Triton's Python backend reports it."""
from __future__ import annotations

from pathlib import Path

_model_dir = ""


def set_model_dir(model_file: str) -> None:
    """Remember the folder of ``model_file`` (the model's version directory); the worker and the auto-complete
    process call this when they import the model."""
    global _model_dir
    _model_dir = str(Path(model_file).parent)


def get_model_dir() -> str:
    """The model's version directory (``<model repository>/<model>/<version>``), where its ``model.py`` is: the
    folder of the model file, as Triton's stub computes it. Triton's vLLM model reads its ``model.json`` there."""
    return _model_dir
