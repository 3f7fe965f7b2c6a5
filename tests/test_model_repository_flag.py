"""A --model-repository that cannot be listed stops start-up with one line naming it, whatever the control mode."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from triton_serve._engine.errors import ServerError
from triton_serve._engine.server import Server, ServerOptions


def run_cli(*flags: str) -> subprocess.CompletedProcess[str]:
    """``python -m triton_serve`` with these flags, on ports the OS picks; it must exit by itself."""
    return subprocess.run([sys.executable, "-m", "triton_serve", *flags, "--http-port=0", "--grpc-port=0",
                           "--metrics-port=0", "--frontend-processes=0"],
                          capture_output=True, text=True, timeout=60)


def test_a_missing_repository_is_one_error_line_and_a_failed_exit(tmp_path: Path) -> None:
    missing = tmp_path / "models"
    finished = run_cli(f"--model-repository={missing}")
    assert finished.returncode == 1
    assert finished.stderr.splitlines() == [
        f"error: cannot list model repository '{missing}': No such file or directory"]


def test_a_file_named_as_the_repository_fails_explicit_mode_too(tmp_path: Path) -> None:
    file = tmp_path / "models.txt"
    file.write_text("not a folder")
    finished = run_cli(f"--model-repository={file}", "--model-control-mode=explicit", "--load-model=add_sub")
    assert finished.returncode == 1
    assert finished.stderr.splitlines() == [f"error: cannot list model repository '{file}': Not a directory"]


@pytest.mark.parametrize("mode", ["none", "poll", "explicit"])
def test_every_control_mode_lists_the_repositories_at_start_up(tmp_path: Path, mode: str) -> None:
    (tmp_path / "present").mkdir()
    missing = tmp_path / "missing"
    server = Server(ServerOptions(model_repositories=[str(tmp_path / "present"), str(missing)],
                                  model_control_mode=mode, allow_http=False, allow_grpc=False, allow_metrics=False))
    with pytest.raises(ServerError) as raised:
        asyncio.run(server.start())
    assert raised.value.message == f"cannot list model repository '{missing}': No such file or directory"


def test_an_openai_port_without_its_plugin_stops_the_start_before_any_model_loads(tmp_path: Path) -> None:
    model = tmp_path / "models" / "slow_to_fail"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('backend: "no_such_backend"\nmax_batch_size: 0\n')
    finished = run_cli(f"--model-repository={tmp_path / 'models'}", "--exit-on-error=true", "--plugin=no:openai",
                       "--openai-port=9")
    assert finished.returncode == 1
    assert "slow_to_fail" not in finished.stderr  # the model was never tried
    assert finished.stderr.splitlines()[-1] == (
        "error: --openai-port needs the OpenAI front-end plugin (pip install triton-serve-openai)")
