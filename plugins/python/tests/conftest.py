"""Fixtures for the python backend tests: repositories of Triton-style models written into tmp_path."""
from __future__ import annotations

import os
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as http

from triton_serve.plugin import ServerOptions
from triton_serve.testing import RunningServer, free_port

SHM = Path("/dev/shm")


class ModelTestKit:
    """Helpers the tests reach through the ``kit`` fixture (test modules import nothing from here)."""

    # Y = 2X; REQUESTS = how many requests this execute call got; ROWS = how many rows the request had.
    # X above 1000 makes it return one row too few; a negative X makes it answer with an error.
    batch_reporter_model = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                if (x < 0).any():
                    error = pb_utils.TritonError("X holds a negative value", pb_utils.TritonError.INVALID_ARG)
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                if (x > 1000).any():
                    x = x[1:]
                rows = x.shape[0]
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("Y", x * np.float32(2)),
                    pb_utils.Tensor("REQUESTS", np.full((rows, 1), len(requests), np.int32)),
                    pb_utils.Tensor("ROWS", np.full((rows, 1), rows, np.int32))], parameters={"rows": rows}))
            return responses
"""

    @staticmethod
    def write_model(repo: Path, name: str, model_py: str, config: str | None = None,
                    files: dict[str, str] | None = None) -> Path:
        """``<repo>/<name>/config.pbtxt`` (unless None) and ``<repo>/<name>/1/model.py``; returns the model dir."""
        model_dir = repo / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "1" / "model.py").write_text(textwrap.dedent(model_py))
        if config is not None:
            (model_dir / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n' + textwrap.dedent(config))
        for filename, text in (files or {}).items():
            (model_dir / filename).write_text(text)
        return model_dir

    @staticmethod
    def shm_entries(prefix: str) -> list[str]:
        return sorted(path.name for path in SHM.glob(prefix + "*"))

    @staticmethod
    def mapped_arenas(prefix: str) -> set[str]:
        """The arenas this process (an in-process server) maps, by name: /proc/self/maps shows each mapping as
        ``/dev/shm/<name> (deleted)`` once its worker has removed the name."""
        return {line.split("/dev/shm/", 1)[1].split()[0] for line in Path("/proc/self/maps").read_text().splitlines()
                if f"/dev/shm/{prefix}" in line}

    @staticmethod
    def wait_until(condition: Callable[[], bool], what: str, deadline_s: float = 60.0) -> None:
        """Poll ``condition`` until it holds; fail (naming ``what``) if it never does. Not a timing assertion."""
        deadline = time.monotonic() + deadline_s
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"gave up waiting for {what}")
            time.sleep(0.02)

    @staticmethod
    def infer(client: http.InferenceServerClient, model: str, binary: bool = True,
              **arrays: np.ndarray) -> http.InferResult:
        """Infer with one input per keyword (name=array); datatypes follow the arrays."""
        inputs = []
        for name, array in arrays.items():
            datatype = "BYTES" if array.dtype.kind in "OSU" else http.np_to_triton_dtype(array.dtype)
            tensor = http.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array, binary_data=binary)
            inputs.append(tensor)
        return client.infer(model, inputs)

    @staticmethod
    def start_server(repo: Path, shm_prefix: str, **options: Any) -> RunningServer:
        """A server outside the ``tserve`` fixture, for module-scoped servers and tests that stop it themselves."""
        for key in ("http_port", "grpc_port", "metrics_port"):
            options.setdefault(key, free_port())
        for key in ("http_address", "grpc_address", "metrics_address"):
            options.setdefault(key, "127.0.0.1")
        options.setdefault("backend_config", {"python": {"shm-region-prefix-name": shm_prefix}})
        return RunningServer(ServerOptions(model_repositories=[str(repo)], **options))


@pytest.fixture(scope="session")
def kit() -> type[ModelTestKit]:
    return ModelTestKit


@pytest.fixture
def shm_prefix() -> str:
    """A shared-memory name prefix no other server uses, so a test can look for its leftovers."""
    return f"tsp_test_{os.getpid()}_{uuid.uuid4().hex[:8]}_"


@pytest.fixture
def python_server(tserve: Callable[..., RunningServer], shm_prefix: str) -> Callable[..., RunningServer]:
    """``tserve`` with this test's shared-memory prefix."""
    def start(repo: Path, **options: Any) -> RunningServer:
        options.setdefault("backend_config", {"python": {"shm-region-prefix-name": shm_prefix}})
        return tserve(repo, **options)
    return start


@pytest.fixture
def client_for() -> Iterator[Callable[[RunningServer], http.InferenceServerClient]]:
    clients: list[http.InferenceServerClient] = []

    def make(server: RunningServer) -> http.InferenceServerClient:
        clients.append(http.InferenceServerClient(server.http_url, network_timeout=120))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(server: RunningServer) -> Iterator[http.InferenceServerClient]:
    """An HTTP client for the test module's ``server`` fixture."""
    client = http.InferenceServerClient(server.http_url)
    yield client
    client.close()
