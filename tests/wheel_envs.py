"""Wheels of the core and of every plugin, and fresh virtual environments that install them (tests/test_wheels.py)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import tritonclient.http as httpclient

from triton_serve.testing import PLUGINS_ENV, free_port

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "scripts" / "constraints.txt"
_NOT_PACKAGED = shutil.ignore_patterns("tests", "bench", "build", "dist", "*.egg-info", "__pycache__")
# What must not leak from this interpreter's environment into the virtual environments' processes.
_OUTSIDE_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", PLUGINS_ENV)
T = TypeVar("T")


def build_wheels(out: Path, scratch: Path) -> dict[str, Path]:
    """A wheel of the core and of each plugin, built from copies of their sources (the build writes
    nothing into the checkout), by two ``pip wheel`` processes at once; distribution name -> wheel."""
    core = scratch / "triton-serve"
    core.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, core / name)
    shutil.copytree(ROOT / "core", core / "core", ignore=_NOT_PACKAGED)
    plugins = [Path(shutil.copytree(project.parent, scratch / project.parent.name, ignore=_NOT_PACKAGED))
               for project in sorted((ROOT / "plugins").glob("*/pyproject.toml"))]
    projects = [core, *plugins]
    builds = [subprocess.Popen([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                                "-w", str(out), *map(str, half)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True) for half in (projects[0::2], projects[1::2])]
    for build in builds:
        output, _ = build.communicate()
        if build.returncode:
            raise RuntimeError(f"pip wheel failed:\n{output}")
    wheels = {re.sub(r"-.*", "", wheel.name).replace("_", "-"): wheel for wheel in out.glob("*.whl")}
    if len(wheels) != len(projects):
        raise RuntimeError(f"expected {len(projects)} wheels, got {sorted(wheels)}")
    return wheels


def outside_environment() -> dict[str, str]:
    """This process's environment less what would put anything but the virtual environment on the path."""
    environ = {key: value for key, value in os.environ.items() if key not in _OUTSIDE_VARIABLES}
    environ["PYTHONNOUSERSITE"] = "1"
    return environ


class VirtualEnv:
    """A fresh virtual environment without a pip of its own: this interpreter's pip installs into it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def script(self, name: str) -> Path:
        """A console script the environment installed (``triton-serve``)."""
        return self.path / "bin" / name

    def pip(self, *arguments: str) -> str:
        """Run ``pip <arguments>`` against this environment (constraints as scripts/install.sh applies them);
        raise with pip's output when it fails."""
        finished = subprocess.run([sys.executable, "-m", "pip", "--python", str(self.python), *arguments],
                                  capture_output=True, text=True, env=outside_environment())
        if finished.returncode:
            raise RuntimeError(f"pip {' '.join(arguments)} failed in {self.path}:\n{finished.stdout}{finished.stderr}")
        return finished.stdout

    def install(self, *requirements: str) -> None:
        self.pip("install", "-q", "-c", str(CONSTRAINTS), *requirements)

    def run(self, *command: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
        """A command of this environment (``python``, ``triton-serve``) run from ``cwd``."""
        program, *arguments = command
        return subprocess.run([str(self.path / "bin" / program), *map(str, arguments)], cwd=cwd,
                              capture_output=True, text=True, timeout=300, env=outside_environment())

    def site_packages_bytes(self) -> int:
        """The size of everything installed into the environment's site-packages."""
        [site] = self.path.glob("lib/python*/site-packages")
        return sum(path.lstat().st_size for path in site.rglob("*") if path.is_file() and not path.is_symlink())


def run_in_parallel(jobs: dict[str, Callable[[], T]], workers: int) -> dict[str, T | Exception]:
    """Run each job in a thread pool; name -> its result, or the exception it raised."""
    def outcome(job: Callable[[], T]) -> T | Exception:
        try:
            return job()
        except Exception as error:  # reported by the test of that environment, not by every test
            return error
    with ThreadPoolExecutor(workers) as pool:
        futures = {name: pool.submit(outcome, job) for name, job in jobs.items()}
    return {name: future.result() for name, future in futures.items()}


@contextmanager
def serving(env: VirtualEnv, cwd: Path, *flags: str) -> Iterator[tuple[httpclient.InferenceServerClient, str]]:
    """``triton-serve`` of ``env`` with these flags on free loopback ports, run from ``cwd``; yields an HTTP
    client and the gRPC address once the server is live (models load before the front-ends open)."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log = cwd / f"server-{http_port}.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [str(env.script("triton-serve")), *flags, "--frontend-processes=0", "--http-address=127.0.0.1",
             f"--http-port={http_port}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc_port}",
             "--metrics-address=127.0.0.1", f"--metrics-port={metrics_port}"],
            cwd=cwd, env=outside_environment(), stdout=output, stderr=subprocess.STDOUT)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    try:
        _wait_until_live(process, client, log)
        yield client, f"127.0.0.1:{grpc_port}"
    finally:
        client.close()
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_live(process: subprocess.Popen[bytes], client: httpclient.InferenceServerClient, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"triton-serve exited with status {process.returncode}:\n{log.read_text()}")
        try:
            if client.is_server_live():
                return
        except Exception:  # not listening yet
            pass
        time.sleep(0.2)
    raise RuntimeError(f"triton-serve was not live after 120 s:\n{log.read_text()}")
