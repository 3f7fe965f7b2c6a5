"""Fixtures for the batching tests: a model served by the core's ``toy_probe`` backend, which
reports how each request was batched."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from triton_serve.testing import RunningServer, ToyBackendsPlugin, probe_config


@pytest.fixture
def serve_probe(tserve, tmp_path: Path) -> Callable[..., RunningServer]:  # type: ignore[no-untyped-def]
    """``serve_probe(extra_config, max_batch_size=8, ragged=False, **server_options)``: serve one
    ``toy_probe`` model named "probe" whose config is ``probe_config()`` plus ``extra_config``."""
    def start(extra_config: str = "", *, max_batch_size: int = 8, ragged: bool = False,
              **options: Any) -> RunningServer:
        model_dir = tmp_path / "models" / "probe"
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(probe_config(max_batch_size, ragged) + extra_config)
        return tserve(tmp_path / "models", extra_plugins=[("toy", ToyBackendsPlugin())], **options)
    return start
