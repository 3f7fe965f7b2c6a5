"""Front-end processes: every one answers, model control and statistics are shared through the model
owner, and a killed one loses only its own requests and is restarted while the server stays ready.

(The HTTP, gRPC and stream suites also run whole through two front-end processes: see their
``frontend_processes`` fixtures.)"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_serve.testing import probe_config

from .conftest import ADD_SUB
from .test_grpc import REPEAT
from .test_trace import trace_config

PROCESSES = 2


@pytest.fixture
def server(add_model, toy_server):  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("probe", probe_config(max_batch_size=8))
    add_model("stream", REPEAT)
    return toy_server(frontend_processes=PROCESSES, model_control_mode="explicit", load_models=["*"])


def add_sub_body(value: int) -> dict[str, object]:
    data = [value] * 16
    return {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": data} for n in ("INPUT0", "INPUT1")]}


def infer_on_new_connection(server, value: int) -> list[int]:  # type: ignore[no-untyped-def]
    """One request on a connection of its own, so SO_REUSEPORT may hand it to any front-end process."""
    with httpx.Client() as client:
        response = client.post(f"http://{server.http_url}/v2/models/add_sub/infer", json=add_sub_body(value))
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


def endpoints(server):  # type: ignore[no-untyped-def]
    return [process.endpoint for process in server.server.frontends.processes]


def test_every_front_end_process_answers(server) -> None:  # type: ignore[no-untyped-def]
    pids = server.server.frontends.pids()
    assert len(pids) == PROCESSES and os.getpid() not in pids
    for value in range(40):
        assert infer_on_new_connection(server, value) == [2 * value] * 16
    served = [endpoint.served for endpoint in endpoints(server)]
    assert sum(served) == 40
    assert all(count > 0 for count in served), served  # 40 connections never all hash to one process


def test_statistics_and_model_control_are_shared(server) -> None:  # type: ignore[no-untyped-def]
    for value in range(12):
        infer_on_new_connection(server, value)
    client = httpclient.InferenceServerClient(server.http_url)
    stats = client.get_inference_statistics("add_sub")["model_stats"][0]
    assert stats["inference_count"] == 12 and stats["inference_stats"]["success"]["count"] == 12
    client.unload_model("add_sub")
    for _ in range(6):  # whichever process a connection reaches, the model is gone for all
        with httpx.Client() as fresh:
            response = fresh.post(f"http://{server.http_url}/v2/models/add_sub/infer", json=add_sub_body(1))
        assert response.status_code == 404 and "Request for unknown model" in response.json()["error"]
    client.load_model("add_sub")
    assert infer_on_new_connection(server, 3) == [6] * 16
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
        assert grpc_client.is_model_ready("add_sub") and grpc_client.is_server_ready()
        index = {entry.name: entry.state for entry in grpc_client.get_model_repository_index().models}
        assert index["add_sub"] == "READY"


def test_streams_and_errors_cross_the_channel(server) -> None:  # type: ignore[no-untyped-def]
    received: list[object] = []
    done = threading.Event()

    def callback(result, error) -> None:  # type: ignore[no-untyped-def]
        received.append(str(error) if error is not None else int(result.as_numpy("OUTPUT0")[0]))
        if len(received) == 5:
            done.set()

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback)
        count = grpcclient.InferInput("INPUT0", [1], "INT32")
        count.set_data_from_numpy(np.array([4], dtype=np.int32))
        client.async_stream_infer("stream", [count])
        client.async_stream_infer("missing", [count])
        assert done.wait(30)
        client.stop_stream()
    assert sorted(r for r in received if isinstance(r, int)) == [0, 1, 2, 3], received
    errors = [r for r in received if not isinstance(r, int)]
    assert len(errors) == 1 and "Request for unknown model: 'missing' is not found" in str(errors[0])


def probe_request(seconds: float) -> dict[str, object]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [seconds]}]}


def test_killed_front_end_process_loses_only_its_requests_and_is_restarted(server) -> None:  # type: ignore[no-untyped-def]
    pool = server.server.frontends
    outcomes: list[str] = []

    def slow_request() -> None:
        try:
            with httpx.Client(timeout=30) as client:
                response = client.post(f"http://{server.http_url}/v2/models/probe/infer", json=probe_request(1.5))
            outcomes.append("ok" if response.status_code == 200 else f"status {response.status_code}")
        except httpx.TransportError:
            outcomes.append("connection lost")

    threads = [threading.Thread(target=slow_request) for _ in range(16)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while sum(len(endpoint.requests) for endpoint in endpoints(server)) < 16 and time.monotonic() < deadline:
        time.sleep(0.02)
    victim = next(p for p in pool.processes if p.endpoint.requests)
    victim_pid, victim_requests = victim.process.pid, len(victim.endpoint.requests)
    os.kill(victim_pid, signal.SIGKILL)
    for thread in threads:
        thread.join(40)
    assert len(outcomes) == 16  # nothing hangs
    assert outcomes.count("connection lost") == victim_requests  # only the killed process's clients fail
    assert outcomes.count("ok") == 16 - victim_requests
    # the server stayed ready, and the process comes back with a new pid
    assert httpx.get(f"http://{server.http_url}/v2/health/ready").status_code == 200
    deadline = time.monotonic() + 60
    while (len(pool.pids()) < PROCESSES or victim_pid in pool.pids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pool.pids()) == PROCESSES and victim_pid not in pool.pids()
    for endpoint in endpoints(server):
        endpoint.served = 0
    for value in range(30):
        assert infer_on_new_connection(server, value) == [2 * value] * 16
    assert all(endpoint.served > 0 for endpoint in endpoints(server))


@pytest.mark.parametrize("change", ["log", "trace"])
def test_a_settings_change_is_answered_once_every_front_end_process_has_it(add_model, toy_server, tmp_path,  # type: ignore[no-untyped-def]
                                                                          change: str) -> None:
    """A log or trace settings change is answered only when each front-end process says it is in force, so that
    a request sent right after the answer is logged or traced as the change says, whichever process takes it:
    a stopped process holds the answer back until it runs again."""
    add_model("add_sub", ADD_SUB)
    server = toy_server(frontend_processes=PROCESSES, trace_config=trace_config(f"triton,file={tmp_path / 't.json'}"))
    dataplane = server.server.dataplane
    before = dataplane.log_control.settings.as_dict()
    update = {"log": lambda: dataplane.update_log_settings({"log_verbose_level": 1}),
              "trace": lambda: dataplane.trace_setting("", {"level": 1})}[change]
    stopped = server.server.frontends.pids()[0]
    os.kill(stopped, signal.SIGSTOP)
    try:
        answer = asyncio.run_coroutine_threadsafe(update(), server.loop)
        time.sleep(1)
        assert not answer.done()  # the stopped process has not said it has the change
    finally:
        os.kill(stopped, signal.SIGCONT)
    answer.result(timeout=10)
    assert not any(endpoint.applied for endpoint in endpoints(server))  # both said so
    assert dataplane.trace_armed == (change == "trace")
    server.call(lambda: dataplane.update_log_settings({"log_verbose_level": before["log_verbose_level"]}))


def test_a_taken_port_fails_the_start_with_a_clear_error(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    first = toy_server()
    with pytest.raises(Exception) as raised:
        toy_server(frontend_processes=PROCESSES, http_port=first.options.http_port)
    assert f"cannot bind 127.0.0.1:{first.options.http_port}" in str(raised.value)


def test_stop_leaves_no_front_end_process_behind(server) -> None:  # type: ignore[no-untyped-def]
    pids = server.server.frontends.pids()
    server.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{server.http_url}/v2/health/live")
