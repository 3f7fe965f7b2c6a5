"""One process per instance: two instances run at once; no shared memory is left behind, however the server ends."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as http

from triton_serve.testing import free_port

# Each execute records its window; it waits (up to 10 s) until a second execute has started, which
# happens in time only if the two requests run in two processes at once.
OVERLAP = """
    import os
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.windows = os.path.join(args["model_repository"], "windows.txt")

        def starts(self):
            with open(self.windows) as windows:
                return sum(1 for line in windows if line.startswith("start"))

        def execute(self, requests):
            with open(self.windows, "a") as windows:
                windows.write(f"start {os.getpid()} {time.time()}\\n")
            deadline = time.monotonic() + 10
            while self.starts() < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            with open(self.windows, "a") as windows:
                windows.write(f"end {os.getpid()} {time.time()}\\n")
            return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))])
                    for _ in requests]
"""
ECHO_PID = """
    import os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([
                        pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy()),
                        pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))]) for r in requests]
"""
TWO_INSTANCES = 'instance_group [ { count: 2, kind: KIND_CPU } ]\n'


def test_two_instances_run_two_requests_at_once(kit: Any, tmp_path: Path, python_server: Any) -> None:
    model_dir = kit.write_model(tmp_path, "overlap", OVERLAP, TWO_INSTANCES + """
        output [ { name: "PID", data_type: TYPE_INT64, dims: [ 1 ] } ]
    """)
    (model_dir / "windows.txt").touch()
    server = python_server(tmp_path)
    pids: list[int] = []

    def one_request() -> None:
        with http.InferenceServerClient(server.http_url, network_timeout=60) as client:
            pids.append(int(client.infer("overlap", []).as_numpy("PID")[0]))

    threads = [threading.Thread(target=one_request) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    windows: dict[int, dict[str, float]] = {}
    for line in (model_dir / "windows.txt").read_text().splitlines():
        event, pid, when = line.split()
        windows.setdefault(int(pid), {})[event] = float(when)
    assert len(windows) == 2 and sorted(windows) == sorted(pids)
    first, second = windows.values()
    assert max(first["start"], second["start"]) < min(first["end"], second["end"])  # the windows overlap


def test_no_shared_memory_is_left_behind(kit: Any, tmp_path: Path, shm_prefix: str) -> None:
    kit.write_model(tmp_path, "echo_pid", ECHO_PID, TWO_INSTANCES + """
        input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]
        output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] },
                 { name: "PID", data_type: TYPE_INT64, dims: [ 1 ] } ]
        parameters { key: "shm-default-byte-size", value: { string_value: "1048576" } }
    """)
    server = kit.start_server(tmp_path, shm_prefix, model_control_mode="explicit", load_models=["echo_pid"])
    try:
        client = http.InferenceServerClient(server.http_url, network_timeout=60)
        # Each worker removes its arenas' names once it has mapped them: /dev/shm holds none of them while the
        # server runs, and the server (this process) maps two per worker.
        assert kit.shm_entries(shm_prefix) == [] and len(kit.mapped_arenas(shm_prefix)) == 4
        big = np.ones(400_000, dtype=np.float32)  # both arenas of one worker grow: replaced, not added
        pid = int(kit.infer(client, "echo_pid", X=big).as_numpy("PID")[0])
        assert kit.shm_entries(shm_prefix) == [] and len(kit.mapped_arenas(shm_prefix)) == 4
        before = kit.mapped_arenas(shm_prefix)
        os.kill(pid, signal.SIGKILL)
        kit.wait_until(lambda: kit.mapped_arenas(shm_prefix) != before and kit.shm_entries(shm_prefix) == [],
                       "the killed worker to be restarted and to map its new arenas")
        assert len(kit.mapped_arenas(shm_prefix)) == 4  # the dead worker's arenas went with it
        client.unload_model("echo_pid")
        assert kit.mapped_arenas(shm_prefix) == set()
        client.load_model("echo_pid")
        assert kit.shm_entries(shm_prefix) == [] and len(kit.mapped_arenas(shm_prefix)) == 4
        client.close()
    finally:
        server.stop()
    assert kit.shm_entries(shm_prefix) == [] and kit.mapped_arenas(shm_prefix) == set()



@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_a_server_process_leaves_no_shared_memory_however_it_ends(kit: Any, tmp_path: Path, how: str) -> None:
    """A real ``triton-serve`` process: SIGTERM (a service manager's stop) and SIGINT (Ctrl-C, to the whole
    process group) stop it; SIGKILL to the whole group ends every process at once, resource tracker included.
    No arena of it is left in /dev/shm, and none is named while it serves."""
    kit.write_model(tmp_path, "echo_pid", ECHO_PID, TWO_INSTANCES + """
        input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]
        output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] },
                 { name: "PID", data_type: TYPE_INT64, dims: [ 1 ] } ]
    """)
    prefix = f"tserve_python_test_{uuid.uuid4().hex[:8]}_"
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "triton_serve", f"--model-repository={tmp_path}", f"--http-port={http_port}",
         f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}", "--http-address=127.0.0.1",
         "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
         f"--backend-config=python,shm-region-prefix-name={prefix}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        client = http.InferenceServerClient(f"127.0.0.1:{http_port}", network_timeout=60)

        def ready() -> bool:
            assert server.poll() is None, f"the server exited with {server.returncode}"
            try:
                return bool(client.is_server_ready())
            except Exception:
                return False
        kit.wait_until(ready, "the server to be ready", deadline_s=90)
        for size in (4, 3_000_000):  # the second grows the worker's arenas: new ones, mapped and unnamed too
            x = np.ones(size, dtype=np.float32)
            np.testing.assert_array_equal(kit.infer(client, "echo_pid", X=x).as_numpy("Y"), x)
        kit.wait_until(lambda: kit.shm_entries(prefix) == [], "the workers to map their arenas")
        client.close()
        if how == "SIGTERM":
            server.send_signal(signal.SIGTERM)
        else:
            os.killpg(server.pid, getattr(signal, how))
        server.wait(timeout=90)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
    assert kit.shm_entries(prefix) == []
