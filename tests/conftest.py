"""Shared fixtures for the core tests: writing small model repositories."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

ADD_SUB = """
backend: "toy_add_sub"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def write_model(root: Path, name: str, config: str | None, versions: Iterable[str | int] = (1,),
                files: dict[str, str] | None = None) -> Path:
    """Create ``root/name`` with an optional config.pbtxt, version folders and extra files."""
    model_dir = root / name
    model_dir.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    for version in versions:
        (model_dir / str(version)).mkdir(exist_ok=True)
    for relative, text in (files or {}).items():
        path = model_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return model_dir


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    return root


@pytest.fixture
def add_model(repo: Path) -> Callable[..., Path]:
    def add(name: str, config: str | None, versions: Iterable[str | int] = (1,),
            files: dict[str, str] | None = None) -> Path:
        return write_model(repo, name, config, versions, files)
    return add


@pytest.fixture
def toy_server(tserve, toy_plugin, repo):  # type: ignore[no-untyped-def]
    """Start a server on ``repo`` with the toy backends; call it after adding models."""
    def start(**options):  # type: ignore[no-untyped-def]
        return tserve(repo, extra_plugins=[("toy", toy_plugin)], **options)
    return start
