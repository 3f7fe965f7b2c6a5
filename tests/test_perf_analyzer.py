"""perf_analyzer, NVIDIA's load generator, runs against triton-serve unchanged (a smoke check, not a benchmark)."""
from __future__ import annotations

import csv
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from triton_serve.testing import EXAMPLE_REPOSITORY

from .conftest import ADD_SUB

PERF_ANALYZER = Path(__file__).parents[1] / "scripts" / "perf_analyzer"


def _perf_analyzer_works() -> str | None:
    try:
        done = subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"perf_analyzer cannot run: {error}"
    return None if done.returncode == 0 else "perf_analyzer is not installed (run scripts/install.sh)"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_completes_without_errors(protocol: str, add_model, toy_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reason = _perf_analyzer_works()
    if reason:
        pytest.skip(reason)
    add_model("add_sub", ADD_SUB)
    server = toy_server()
    _run_cleanly(server, protocol, tmp_path)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_with_system_shared_memory(protocol: str, tserve: Callable[..., Any], tmp_path: Path) -> None:
    """The example add_sub (a Python-backend model) with every input and output in shared memory."""
    reason = _perf_analyzer_works()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("triton_serve_python", reason="the example add_sub needs the Python backend plugin")
    server = tserve(EXAMPLE_REPOSITORY, model_control_mode="explicit", load_models=["add_sub"])
    _run_cleanly(server, protocol, tmp_path, "--shared-memory", "system")


def _run_cleanly(server: Any, protocol: str, tmp_path: Path, *options: str) -> None:
    report = tmp_path / "report.csv"
    url = server.http_url if protocol == "http" else server.grpc_url
    try:
        done = subprocess.run(
            [str(PERF_ANALYZER), "-m", "add_sub", "-u", url, "-i", protocol, "--concurrency-range", "2:2",
             "--request-count", "200",  # a fixed amount of work: no stability search on a busy machine
             "-f", str(report), *options], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as error:  # say what the server saw: lost requests, or a stuck client
        stdout = error.stdout.decode() if isinstance(error.stdout, bytes) else error.stdout
        statistics = httpx.get(f"{server.http_url}/v2/models/add_sub/stats", timeout=10).text
        pytest.fail(f"perf_analyzer did not finish in 120 s\nserver statistics: {statistics}\n"
                    f"perf_analyzer printed:\n{stdout}")
    assert done.returncode == 0, done.stdout + done.stderr
    with report.open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows and float(rows[0]["Inferences/Second"]) > 0
    assert "error" not in (done.stdout + done.stderr).lower()
