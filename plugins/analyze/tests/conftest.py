"""Fixtures for the analyze tests: model repositories in tmp_path, perf_analyzer (real or a fake)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from triton_serve.testing import EXAMPLE_REPOSITORY

PERF_ANALYZER = Path(__file__).resolve().parents[3] / "scripts" / "perf_analyzer"
FAKE = Path(__file__).with_name("fake_perf_analyzer.py")


@pytest.fixture
def perf_analyzer() -> str:
    """The real perf_analyzer 2.51 of this checkout (scripts/install.sh), or a skip saying why not."""
    try:
        done = subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"perf_analyzer cannot run: {error}")
    if done.returncode != 0:
        pytest.skip("perf_analyzer is not installed (run scripts/install.sh)")
    return str(PERF_ANALYZER)


@pytest.fixture
def fake_perf_analyzer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An executable that answers like perf_analyzer with made-up figures (fake_perf_analyzer.py)."""
    script = tmp_path / "fake_perf_analyzer"
    script.write_text(f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(FAKE)!r}, run_name='__main__')\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_PA_COUNTER", str(tmp_path / "fake_pa_runs"))
    monkeypatch.setenv("FAKE_PA_INTERVALS", str(tmp_path / "fake_pa_intervals"))
    for name in ("FAKE_PA_P99_US", "FAKE_PA_KILL_AT", "FAKE_PA_KILL_PID", "FAKE_PA_MIN_INTERVAL_MS",
                 "FAKE_PA_STABLE_FROM_MS"):
        monkeypatch.delenv(name, raising=False)
    return str(script)


@pytest.fixture
def add_sub_repo(tmp_path: Path) -> Path:
    """A copy of the example repository's add_sub (a Python-backend model), so outputs land in tmp_path."""
    pytest.importorskip("triton_serve_python", reason="the example add_sub needs the Python backend plugin")
    root = tmp_path / "models"
    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", root / "add_sub")
    return root


def environment_without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names}
