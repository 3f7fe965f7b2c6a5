"""A worker process that dies before it starts (before any model code runs) is replaced at load."""
from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as http

from triton_serve_python import process

MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
"""
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""
CRASH = f"import os; os.kill(os.getpid(), {int(signal.SIGSEGV)})"


def _crashing_first(crashes: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first ``crashes`` worker launches run a process that dies by SIGSEGV at once."""
    launched: list[str] = []
    real = asyncio.create_subprocess_exec

    async def launch(*args: Any, **kwargs: Any) -> Any:
        if len(launched) < crashes:
            launched.append("crashed")
            return await real(sys.executable, "-c", CRASH, **kwargs)
        launched.append("worker")
        return await real(*args, **kwargs)

    monkeypatch.setattr(process.asyncio, "create_subprocess_exec", launch)
    return launched


def _write_model(root: Path) -> Path:
    model = root / "models" / "echo"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    (model / "config.pbtxt").write_text(CONFIG)
    return root / "models"


def test_a_worker_that_dies_before_it_starts_is_replaced(tmp_path: Path, tserve: Any,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    launched = _crashing_first(2, monkeypatch)
    server = tserve(_write_model(tmp_path), frontend_processes=0)
    assert http.InferenceServerClient(server.http_url).is_model_ready("echo")
    assert launched == ["crashed", "crashed", "worker"]
    assert "was killed by signal SIGSEGV before it started; starting another (attempt 2 of 3)" in caplog.text


def test_a_worker_that_keeps_dying_fails_the_load_with_the_reason(tmp_path: Path, tserve: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    launched = _crashing_first(3, monkeypatch)
    server = tserve(_write_model(tmp_path), frontend_processes=0)
    [entry] = http.InferenceServerClient(server.http_url).get_model_repository_index()
    assert entry["state"] == "UNAVAILABLE" and launched == ["crashed"] * 3
    assert entry["reason"].endswith("was killed by signal SIGSEGV before it started")


class _LateConnectionLoop:
    """The running loop, except that ``create_unix_connection`` returns to its caller only after a pause, by which
    time the worker's first message has already been read (as happens when a worker starts quickly)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    async def create_unix_connection(self, *args: Any, **kwargs: Any) -> Any:
        connection = await self._loop.create_unix_connection(*args, **kwargs)
        await asyncio.sleep(1.0)
        return connection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


def test_a_worker_whose_start_message_comes_before_the_connection_is_made_loads(
        tmp_path: Path, tserve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    shim = type(sys)("asyncio_for_process")
    shim.__dict__.update(vars(asyncio))
    shim.get_running_loop = lambda: _LateConnectionLoop(asyncio.get_running_loop())  # type: ignore[attr-defined]
    monkeypatch.setattr(process, "asyncio", shim)
    server = tserve(_write_model(tmp_path), frontend_processes=0)
    [entry] = http.InferenceServerClient(server.http_url).get_model_repository_index()
    assert entry["state"] == "READY", entry
