"""Crashes, exits, hangs and failing initialize are isolated, reported, reflected in readiness, restarted."""
from __future__ import annotations

import logging
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer

# Records each worker start in starts.txt; a restart waits while the file "hold" exists in the model folder.
CRASHY = """
    import ctypes
    import os
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            folder = args["model_repository"]
            with open(os.path.join(folder, "starts.txt"), "a") as starts:
                starts.write(f"{os.getpid()}\\n")
            while os.path.exists(os.path.join(folder, "hold")):
                time.sleep(0.02)

        def execute(self, requests):
            mode = pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0].decode()
            if mode == "segfault":
                ctypes.string_at(0)
            if mode == "exit":
                os._exit(3)
            if mode == "hang":
                time.sleep(3600)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))])]
"""
CRASHY_CONFIG = """
    input [ { name: "MODE", data_type: TYPE_STRING, dims: [ 1 ] } ]
    output [ { name: "PID", data_type: TYPE_INT64, dims: [ 1 ] } ]
"""
HEALTHY = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                        "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]) for r in requests]
"""
HEALTHY_CONFIG = """
    input [ { name: "X", data_type: TYPE_INT32, dims: [ 2 ] } ]
    output [ { name: "Y", data_type: TYPE_INT32, dims: [ 2 ] } ]
"""
FAILING_INIT = """
    import os
    import time

    class TritonPythonModel:
        def initialize(self, args):
            how = args["model_name"]
            if how == "init_raises":
                raise RuntimeError("cannot open the weights")
            if how == "init_exits":
                os._exit(5)
            if how == "init_hangs":
                time.sleep(3600)

        def execute(self, requests):
            return []
"""
CONFLICTING_AUTO_COMPLETE = """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [3]})
            return config

        def execute(self, requests):
            return []
"""


def _mode(value: str) -> dict[str, np.ndarray]:
    return {"MODE": np.array([value.encode()], dtype=object)}


def _pid(kit: Any, client: http.InferenceServerClient, model: str = "crashy") -> int:
    return int(kit.infer(client, model, **_mode("ok")).as_numpy("PID")[0])


def _healthy_serves(kit: Any, client: http.InferenceServerClient) -> bool:
    x = np.array([1, 2], dtype=np.int32)
    return kit.infer(client, "healthy", X=x).as_numpy("Y").tolist() == [2, 4]


# ---- crashes in execute ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def crash_server(tmp_path_factory: pytest.TempPathFactory, kit: Any) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("crashes")
    kit.write_model(repo, "crashy", CRASHY, CRASHY_CONFIG + """
        parameters { key: "execute-timeout-seconds", value: { string_value: "2" } }
    """)
    kit.write_model(repo, "healthy", HEALTHY, HEALTHY_CONFIG)
    running = kit.start_server(repo, f"tsp_crashes_{os.getpid()}_{uuid.uuid4().hex[:6]}_")
    yield running
    running.stop()


@pytest.mark.parametrize(("mode", "how"), [
    ("segfault", "was killed by signal SIGSEGV"),
    ("exit", "exited with code 3"),
    ("hang", "was killed because execute did not finish within 2 s"),
])
def test_a_dying_worker_fails_its_request_and_restarts(kit: Any, crash_server: RunningServer, mode: str, how: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="triton_serve_python")
    client = http.InferenceServerClient(crash_server.http_url, network_timeout=120)
    kit.wait_until(lambda: client.is_model_ready("crashy"), "crashy to be ready")
    before = _pid(kit, client)
    with pytest.raises(InferenceServerException) as raised:
        kit.infer(client, "crashy", **_mode(mode))
    assert raised.value.status() == "500"
    assert raised.value.message() == (f"python backend worker for instance 'crashy_0_0' of python model 'crashy' "
                                      f"{how} while executing the request; it is being restarted")
    assert _healthy_serves(kit, client)
    kit.wait_until(lambda: client.is_model_ready("crashy"), "crashy to be restarted")
    assert _pid(kit, client) != before
    assert client.is_server_ready()
    messages = [record.getMessage() for record in caplog.records]
    assert f"python backend worker for instance 'crashy_0_0' of python model 'crashy' {how}" in messages
    assert "restarted the python backend worker for instance 'crashy_0_0' of python model 'crashy'" in messages
    client.close()


# ---- readiness and restarts --------------------------------------------------------------------

def test_readiness_follows_the_worker(kit: Any, tmp_path: Path, python_server: Any, client_for: Any,
                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="triton_serve_python")
    model_dir = kit.write_model(tmp_path, "crashy", CRASHY, CRASHY_CONFIG)
    kit.write_model(tmp_path, "healthy", HEALTHY, HEALTHY_CONFIG)
    client = client_for(python_server(tmp_path))
    assert client.is_server_ready() and client.is_model_ready("crashy")
    (model_dir / "hold").touch()  # the restart will wait in initialize until the file goes
    first = _pid(kit, client)
    os.kill(first, signal.SIGKILL)  # dies while idle: nobody is waiting on it
    kit.wait_until(lambda: not client.is_model_ready("crashy"), "crashy to turn not ready")
    assert not client.is_server_ready()
    with pytest.raises(InferenceServerException):
        _pid(kit, client)
    assert _healthy_serves(kit, client)
    kit.wait_until(lambda: len((model_dir / "starts.txt").read_text().split()) == 2, "the restart to begin")
    assert not client.is_model_ready("crashy")
    (model_dir / "hold").unlink()
    kit.wait_until(lambda: client.is_model_ready("crashy"), "crashy to be ready again")
    assert client.is_server_ready()
    assert _pid(kit, client) not in (first, 0)
    assert any(r.getMessage() == "python backend worker for instance 'crashy_0_0' of python model 'crashy' "
               "was killed by signal SIGKILL" for r in caplog.records)


def test_restart_can_be_turned_off(kit: Any, tmp_path: Path, python_server: Any, client_for: Any,
                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="triton_serve_python")
    model_dir = kit.write_model(tmp_path, "crashy", CRASHY, CRASHY_CONFIG + """
        parameters { key: "restart-on-failure", value: { string_value: "false" } }
    """)
    kit.write_model(tmp_path, "healthy", HEALTHY, HEALTHY_CONFIG)
    client = client_for(python_server(tmp_path))
    with pytest.raises(InferenceServerException) as raised:
        kit.infer(client, "crashy", **_mode("exit"))
    assert raised.value.message().endswith("exited with code 3 while executing the request; "
                                           "it will not be restarted")
    assert not client.is_model_ready("crashy") and not client.is_server_ready()
    assert _healthy_serves(kit, client)
    assert any("will not be restarted (restart-on-failure is off)" in r.getMessage() for r in caplog.records)
    with pytest.raises(InferenceServerException):
        _pid(kit, client)
    assert len((model_dir / "starts.txt").read_text().split()) == 1
    assert not client.is_model_ready("crashy")


# ---- failures while loading --------------------------------------------------------------------

def test_failing_initialize_fails_the_load_with_the_reason(kit: Any, tmp_path: Path, python_server: Any,
                                                           client_for: Any, shm_prefix: str) -> None:
    for name in ("init_raises", "init_exits"):
        kit.write_model(tmp_path, name, FAILING_INIT, HEALTHY_CONFIG)
    kit.write_model(tmp_path, "init_hangs", FAILING_INIT, HEALTHY_CONFIG + """
        parameters { key: "stub-timeout-seconds", value: { string_value: "5" } }
    """)
    kit.write_model(tmp_path, "bad_auto_complete", CONFLICTING_AUTO_COMPLETE, HEALTHY_CONFIG)
    kit.write_model(tmp_path, "healthy", HEALTHY, HEALTHY_CONFIG)
    client = client_for(python_server(tmp_path))
    reasons = {entry["name"]: entry.get("reason", "") for entry in client.get_model_repository_index()
               if entry.get("state") != "READY"}
    assert set(reasons) == {"init_raises", "init_exits", "init_hangs", "bad_auto_complete"}
    assert reasons["init_raises"] == ("failed to initialize instance 'init_raises_0_0' of python model "
                                      "'init_raises': RuntimeError: cannot open the weights")
    assert reasons["init_exits"] == ("python backend worker for instance 'init_exits_0_0' of python model "
                                     "'init_exits' exited with code 5 while loading the model")
    assert reasons["init_hangs"] == ("python backend worker for instance 'init_hangs_0_0' of python model "
                                     "'init_hangs' was killed because initialize did not finish within 5 s "
                                     "while loading the model")
    assert "auto_complete_config of python model 'bad_auto_complete' failed: ValueError:" in \
        reasons["bad_auto_complete"]
    assert "gives input 'X' dims [2], but auto_complete_config gives [3]" in reasons["bad_auto_complete"]
    assert _healthy_serves(kit, client) and client.is_model_ready("healthy")
    assert not client.is_server_ready()  # strict readiness: a model that should be loaded is not
    assert kit.shm_entries(shm_prefix) == [] and len(kit.mapped_arenas(shm_prefix)) == 2  # the healthy worker's
