"""Graceful stop, the CLI's flags and signals."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from triton_serve._engine.cli import build_parser, options_from_args
from triton_serve.testing import free_port

from .conftest import write_model

SLOW = """
backend: "toy_identity"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }
output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }
parameters { key: "delay_s" value { string_value: "1.5" } }
"""


def test_stop_finishes_in_flight_requests(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("slow", SLOW)
    server = toy_server()
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    result: dict[str, object] = {}

    def call() -> None:
        tensor = httpclient.InferInput("INPUT0", [1], "INT32")
        tensor.set_data_from_numpy(np.array([42], dtype=np.int32))
        result["out"] = client.infer("slow", [tensor]).as_numpy("OUTPUT0").tolist()

    worker = threading.Thread(target=call)
    worker.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not server.server.dataplane.repository.models["slow"].versions[1] \
            .stats.dequeued:  # the request is running
        time.sleep(0.01)
    server.call(server.server.stop)
    worker.join(30)
    assert result["out"] == [42]
    assert not server.call(server.server.dataplane.server_ready)


def test_cli_maps_triton_flags() -> None:
    args = build_parser().parse_args([
        "--model-repository=/a", "--model-repository", "/b", "--http-port=9000", "--allow-grpc=false",
        "--exit-on-error=true", "--strict-readiness=false", "--strict-model-config=true",
        "--model-control-mode=explicit", "--load-model=m1", "--load-model", "m2",
        "--backend-config=python,shm-default-byte-size=1048576", "--cache-config=local,size=1024",
        "--http-max-input-size=100", "--plugin=no:local_cache"])
    options = options_from_args(args)
    assert options.model_repositories == ["/a", "/b"]
    assert (options.http_port, options.grpc_port, options.metrics_port) == (9000, 8001, 8002)
    assert options.allow_grpc is False and options.exit_on_error is True and options.strict_readiness is False
    assert options.strict_model_config and options.disable_auto_complete_config
    assert options.model_control_mode == "explicit" and options.load_models == ["m1", "m2"]
    assert options.backend_config == {"python": {"shm-default-byte-size": "1048576"}}
    assert options.cache_config == ("local", {"size": "1024"})
    assert options.http_max_input_size == 100 and options.blocked_plugins == ["local_cache"]


def test_cli_rejects_unknown_modes() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model-control-mode=sometimes"])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_cli_exits_cleanly_on_signal(tmp_path, signum: int) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", "from triton_serve._engine.cli import main; raise SystemExit(main())",
         f"--model-repository={tmp_path}", f"--http-port={port}", f"--grpc-port={free_port()}",
         f"--metrics-port={free_port()}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
         "--metrics-address=127.0.0.1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail("server did not become ready")
        process.send_signal(signum)
        assert process.wait(30) == 0, process.communicate(timeout=10)[0].decode()
    finally:
        process.kill()
        output = process.communicate(timeout=10)[0].decode()
    assert "Traceback" not in output, output


# A Python-backend model that touches $STARTED_FILE when a request reaches it, then takes a second.
SLOW_PYTHON = """
import os, pathlib, time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pathlib.Path(os.environ["STARTED_FILE"]).touch()
        time.sleep(1.0)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""
SLOW_PYTHON_CONFIG = """
backend: "python"
max_batch_size: 0
input { name: "X" data_type: TYPE_INT32 dims: [ 1 ] }
output { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }
"""


@pytest.mark.parametrize("frontend_processes", [0, 2])
def test_sigterm_with_a_request_in_flight_drains_it_and_leaves_no_shared_memory(
        tmp_path: Path, frontend_processes: int) -> None:
    pytest.importorskip("triton_serve_python", reason="needs the Python backend plugin")
    write_model(tmp_path / "models", "slow", SLOW_PYTHON_CONFIG, files={"1/model.py": SLOW_PYTHON})
    started, prefix = tmp_path / "started", f"tserve_python_sigterm_{uuid.uuid4().hex[:8]}_"
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", "from triton_serve._engine.cli import main; raise SystemExit(main())",
         f"--model-repository={tmp_path / 'models'}", f"--http-port={port}", f"--grpc-port={free_port()}",
         f"--metrics-port={free_port()}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
         "--metrics-address=127.0.0.1", f"--frontend-processes={frontend_processes}",
         f"--backend-config=python,shm-region-prefix-name={prefix}"],
        env={**os.environ, "STARTED_FILE": str(started)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    answers: list[list[int]] = []
    try:
        deadline = time.monotonic() + 60
        while not _ready(port):
            assert process.poll() is None and time.monotonic() < deadline, "the server did not get ready"
            time.sleep(0.1)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30)
        tensor = httpclient.InferInput("X", [1], "INT32")
        tensor.set_data_from_numpy(np.array([7], dtype=np.int32))
        call = threading.Thread(target=lambda: answers.append(client.infer("slow", [tensor]).as_numpy("Y").tolist()))
        call.start()
        while not started.exists():
            assert time.monotonic() < deadline, "the request never reached the model"
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)  # the model is still sleeping
        call.join(30)
        assert answers == [[7]]
        assert process.wait(30) == 0
    finally:
        process.kill()
        output = process.communicate(timeout=10)[0].decode()
    assert "Traceback" not in output, output
    assert sorted(path.name for path in Path("/dev/shm").glob(f"{prefix}*")) == []


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200
    except httpx.TransportError:
        return False
