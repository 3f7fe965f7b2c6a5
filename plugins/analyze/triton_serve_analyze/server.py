"""The server analyze talks to: a running one (ours or Triton, explicit model control), or one it starts."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class ServerGone(Exception):
    """The server stopped answering (refused connections, died): the sweep cannot go on."""


class LoadFailed(Exception):
    """The server answered a load with an error (the candidate's config is bad for this model)."""


class ServerClient:
    """Triton's HTTP model-repository and model-config endpoints, through the standard library."""

    def __init__(self, url: str, timeout_s: float = 300.0) -> None:
        self.url = url if "://" in url else f"http://{url}"
        self.url = self.url.rstrip("/")
        self.timeout_s = timeout_s

    @property
    def host_port(self) -> str:
        """``host:port``, as perf_analyzer's ``-u`` wants it."""
        return self.url.split("://", 1)[1]

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                status, payload = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, payload = error.code, error.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as error:
            raise ServerGone(f"the server at {self.url} does not answer ({getattr(error, 'reason', error)})") from None
        try:
            return status, json.loads(payload) if payload else {}
        except ValueError:
            return status, {"error": payload.decode(errors="replace")}

    def live(self) -> bool:
        try:
            return self._call("GET", "/v2/health/live")[0] == 200
        except ServerGone:
            return False

    def models(self) -> dict[str, str]:
        """Every model of the repository and its state (``READY``, ``UNAVAILABLE``, "" never loaded)."""
        status, payload = self._call("POST", "/v2/repository/index", {})
        if status != 200:
            raise ServerGone(f"the server at {self.url} failed to list its repository: {_error(payload)}")
        return {entry["name"]: entry.get("state", "") for entry in payload}

    def load(self, model: str, config: dict[str, Any] | None = None) -> None:
        """Load (or reload) ``model``, with ``config`` replacing its config.pbtxt when given."""
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        status, payload = self._call("POST", f"/v2/repository/models/{model}/load", body)
        if status != 200:
            message = _error(payload)
            if "model load / unload is not allowed" in message:  # Triton's words in "none" and "poll" modes
                raise ServerGone(f"the server at {self.url} refuses to load models ({message}); start it with "
                                 "--model-control-mode=explicit")
            raise LoadFailed(message)

    def unload(self, model: str) -> None:
        status, payload = self._call("POST", f"/v2/repository/models/{model}/unload", {})
        if status != 200:
            raise LoadFailed(_error(payload))

    def config(self, model: str) -> dict[str, Any]:
        status, payload = self._call("GET", f"/v2/models/{model}/config")
        if status != 200:
            raise LoadFailed(_error(payload))
        return dict(payload)


def _error(payload: Any) -> str:
    return str(payload.get("error", payload)) if isinstance(payload, dict) else str(payload)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def triton_serve_command() -> list[str]:
    """The ``triton-serve`` console script of this Python environment."""
    beside = Path(sys.executable).with_name("triton-serve")
    found = str(beside) if beside.exists() else shutil.which("triton-serve")
    if not found:
        raise FileNotFoundError("the triton-serve command is not installed beside this Python")
    return [found]


class LocalServer:
    """A ``triton-serve`` process on free loopback ports, in explicit model-control mode, for one analysis."""

    def __init__(self, repository: str, log_path: Path, extra_args: list[str], start_timeout_s: float = 120.0):
        self.log_path = log_path
        ports = [_free_port() for _ in range(3)]
        command = [*triton_serve_command(), "--model-repository", repository, "--model-control-mode", "explicit",
                   "--http-address", "127.0.0.1", "--http-port", str(ports[0]),
                   "--grpc-address", "127.0.0.1", "--grpc-port", str(ports[1]),
                   "--metrics-address", "127.0.0.1", "--metrics-port", str(ports[2]), *extra_args]
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        self.client = ServerClient(f"127.0.0.1:{ports[0]}")
        deadline = time.monotonic() + start_timeout_s
        while not self.client.live():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ServerGone(f"triton-serve did not start (see {log_path}): {self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()
