"""Graceful stop, the CLI's flags and signals."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from triton_serve._engine.cli import build_parser, options_from_args
from triton_serve.testing import free_port

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
