"""Fixtures for the ensemble tests: a repository of the core's toy models, served with the toy backends."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from triton_serve.testing import RunningServer, ToyBackendsPlugin


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    return root


@pytest.fixture
def add_model(repo: Path) -> Callable[[str, str], Path]:
    """``add_model(name, config_text)``: a model directory with version 1."""
    def add(name: str, config: str) -> Path:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        return repo / name
    return add


@pytest.fixture
def serve(tserve, repo: Path) -> Callable[..., RunningServer]:  # type: ignore[no-untyped-def]
    """Start a server on ``repo`` with the toy backends (and ``extra_plugins``)."""
    def start(*extra_plugins: tuple[str, Any], **options: Any) -> RunningServer:
        return tserve(repo, extra_plugins=[("toy", ToyBackendsPlugin()), *extra_plugins], **options)
    return start
