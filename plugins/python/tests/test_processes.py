"""One process per instance: two instances run at once; no shared memory is left behind."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as http

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
        assert len(kit.shm_entries(shm_prefix)) == 4  # two arenas per worker
        big = np.ones(400_000, dtype=np.float32)  # both arenas of one worker grow: replaced, not added
        pid = int(kit.infer(client, "echo_pid", X=big).as_numpy("PID")[0])
        assert len(kit.shm_entries(shm_prefix)) == 4
        before = set(kit.shm_entries(shm_prefix))
        os.kill(pid, signal.SIGKILL)
        kit.wait_until(lambda: client.is_model_ready("echo_pid") and set(kit.shm_entries(shm_prefix)) != before,
                       "the killed worker to be restarted")
        assert len(kit.shm_entries(shm_prefix)) == 4  # the dead worker's arenas went with it
        client.unload_model("echo_pid")
        assert kit.shm_entries(shm_prefix) == []
        client.load_model("echo_pid")
        assert len(kit.shm_entries(shm_prefix)) == 4
        client.close()
    finally:
        server.stop()
    assert kit.shm_entries(shm_prefix) == []
