"""Dynamic batching end to end: a batch reaches model.py in one execute call, and with ``stack_requests``
as one request with stacked inputs whose output rows go back to the right clients."""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpc
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer

pytest.importorskip("triton_serve_batching")

CONFIG = """
    max_batch_size: 8
    dynamic_batching { }
    input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]
    output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] },
             { name: "REQUESTS", data_type: TYPE_INT32, dims: [ 1 ] },
             { name: "ROWS", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""
STACKED = 'parameters { key: "stack_requests", value: { string_value: "true" } }\n'
CLIENTS = {"http": http, "grpc": grpc}


def _rows(client: int, count: int) -> np.ndarray:
    """``count`` rows of X that tell clients apart: client 2's values are 200, 201, ..."""
    return (np.arange(count * 2, dtype=np.float32) + 100 * client).reshape(count, 2)


def _infer(protocol: str, server: RunningServer, x: np.ndarray, outputs: list[str] | None) -> dict[str, Any]:
    """One request with its own client; returns its outputs by name (None for an output it did not get)."""
    module = CLIENTS[protocol]
    url = server.http_url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        tensor = module.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        requested = [module.InferRequestedOutput(name) for name in outputs] if outputs else None
        result = client.infer("reporter", [tensor], outputs=requested)
        return {name: result.as_numpy(name) for name in ("Y", "REQUESTS", "ROWS")}
    finally:
        client.close()


def _concurrently(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls at once (the batcher waits for all of them) and return results or exceptions, in order."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.exception() or future.result() for future in futures]


@pytest.fixture
def batching_server(kit: Any, tmp_path: Path, python_server: Any,
                    monkeypatch: pytest.MonkeyPatch) -> Callable[[str], RunningServer]:
    """A server for the reporter model whose first batch waits for 3 queued requests."""
    def start(config: str) -> RunningServer:
        kit.write_model(tmp_path, "reporter", kit.batch_reporter_model, config)
        monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
        return python_server(tmp_path)
    return start


def _statistics(server: RunningServer) -> dict[str, Any]:
    with http.InferenceServerClient(server.http_url) as client:
        return client.get_inference_statistics("reporter")["model_stats"][0]


def test_a_batch_reaches_one_execute_call(batching_server: Any) -> None:
    server = batching_server(CONFIG)
    xs = [_rows(client, 1) for client in range(3)]
    results = _concurrently([lambda x=x: _infer("http", server, x, None) for x in xs])
    for x, result in zip(xs, results):
        np.testing.assert_array_equal(result["Y"], x * 2)  # each client gets its own response
        np.testing.assert_array_equal(result["REQUESTS"], [[3]])  # from one execute holding all three
        np.testing.assert_array_equal(result["ROWS"], [[1]])
    stats = _statistics(server)
    assert (stats["execution_count"], stats["inference_count"]) == (1, 3)
    assert [(entry["batch_size"], entry["compute_infer"]["count"]) for entry in stats["batch_stats"]] == [(3, 1)]


@pytest.mark.parametrize("protocol", sorted(CLIENTS))
def test_stacked_requests_give_model_one_request_and_clients_their_rows(batching_server: Any,
                                                                         protocol: str) -> None:
    server = batching_server(CONFIG + STACKED)
    xs = [_rows(client, size) for client, size in enumerate((1, 2, 3))]
    wanted: list[list[str] | None] = [["Y"], None, ["Y", "ROWS"]]
    results = _concurrently([lambda x=x, w=w: _infer(protocol, server, x, w) for x, w in zip(xs, wanted)])
    for x, outputs, result in zip(xs, wanted, results):
        np.testing.assert_array_equal(result["Y"], x * 2)  # exactly this client's rows
        if outputs is None or "ROWS" in outputs:
            np.testing.assert_array_equal(result["ROWS"], np.full((len(x), 1), 6))  # the model saw all 6 rows
        if outputs is None:
            np.testing.assert_array_equal(result["REQUESTS"], np.ones((len(x), 1)))  # ...in one request
    assert results[0]["ROWS"] is None and results[0]["REQUESTS"] is None  # only the outputs it asked for
    assert results[2]["REQUESTS"] is None
    stats = _statistics(server)
    assert (stats["execution_count"], stats["inference_count"]) == (1, 6)
    assert [entry["batch_size"] for entry in stats["batch_stats"]] == [6]


def test_an_error_response_to_a_stacked_request_fails_every_request(batching_server: Any) -> None:
    server = batching_server(CONFIG + STACKED)
    xs = [_rows(0, 1), -_rows(1, 2), _rows(2, 1)]  # only the second client sends a negative value
    results = _concurrently([lambda x=x: _infer("http", server, x, None) for x in xs])
    for error in results:
        assert isinstance(error, InferenceServerException)
        assert (error.status(), error.message()) == ("400", "X holds a negative value")
    with http.InferenceServerClient(server.http_url) as client:  # and the model keeps serving
        np.testing.assert_array_equal(_infer("http", server, _rows(3, 2), None)["Y"], _rows(3, 2) * 2)
        assert client.is_model_ready("reporter")


# ---- scheduling as Triton's DynamicBatchScheduler does it (qa/L0_batcher) ----------------------------------

# Execution n writes started_<n> (its request count) into the model's folder, then waits until the test writes
# go_<n>: the test decides when each batch ends, so which requests share a batch does not depend on timing.
GATED = """
    import time
    from pathlib import Path

    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.folder = Path(args["model_repository"])
            self.executions = 0

        def execute(self, requests):
            self.executions += 1
            (self.folder / f"started_{self.executions}").write_text(str(len(requests)))
            deadline = time.monotonic() + 60
            while not (self.folder / f"go_{self.executions}").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            return [pb_utils.InferenceResponse([
                pb_utils.Tensor("EXECUTION", np.array([[self.executions]], np.int32)),
                pb_utils.Tensor("BATCH", np.array([[len(requests)]], np.int32))]) for _ in requests]
"""
GATED_IO = """
    input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
    output [ { name: "EXECUTION", data_type: TYPE_INT32, dims: [ 1 ] },
             { name: "BATCH", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""


class _Gated:
    """The gated model on its server: requests sent on threads, its executions started and let go."""

    def __init__(self, server: RunningServer, folder: Path, kit: Any) -> None:
        self.server, self.folder, self.kit = server, folder, kit
        self.threads = ThreadPoolExecutor(32)

    def send(self, count: int) -> list[Any]:
        return [self.threads.submit(self._one) for _ in range(count)]

    def _one(self) -> tuple[int, int]:
        with http.InferenceServerClient(self.server.http_url, network_timeout=90) as client:
            tensor = http.InferInput("X", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
            result = client.infer("gated", [tensor])
            return int(result.as_numpy("EXECUTION")[0, 0]), int(result.as_numpy("BATCH")[0, 0])

    def started(self, execution: int) -> int:
        """Wait until execution ``execution`` runs; its request count."""
        marker = self.folder / f"started_{execution}"
        self.kit.wait_until(marker.exists, f"execution {execution} to start")
        return int(marker.read_text())

    def let_go(self, execution: int) -> None:
        (self.folder / f"go_{execution}").write_text("")

    def wait_pending(self, count: int) -> None:
        """Wait until ``count`` requests wait in the queue (nv_inference_pending_request_count)."""
        pattern = re.compile(r'^nv_inference_pending_request_count\{model="gated",version="1"\} (\d+)', re.M)

        def pending() -> int:
            found = pattern.search(httpx.get(self.server.metrics_url, timeout=10).text)
            return int(found[1]) if found else -1
        self.kit.wait_until(lambda: pending() == count, f"{count} queued requests (the queue holds {pending()})",
                            deadline_s=20)


@pytest.fixture
def gated(kit: Any, tmp_path: Path, python_server: Any) -> Iterator[Callable[[str], _Gated]]:
    made: list[_Gated] = []

    def start(config: str) -> _Gated:
        folder = kit.write_model(tmp_path, "gated", GATED, config + GATED_IO)
        made.append(_Gated(python_server(tmp_path), folder, kit))
        return made[0]
    yield start
    for model in made:
        for execution in range(1, 5):  # nothing stays blocked, whatever the test reached
            model.let_go(execution)
        model.threads.shutdown()


def test_requests_that_arrive_while_a_batch_runs_form_the_next_batch_together(gated: Any) -> None:
    """Triton: 12 concurrent requests, a slow execute, the default delay of 0: two executions, the first request
    alone, then the 11 that arrived while it ran (ours ran a third: one request left the queue at once)."""
    model = gated("max_batch_size: 16\ndynamic_batching { }\n")
    first = model.send(1)
    assert model.started(1) == 1
    rest = model.send(11)
    model.wait_pending(11)  # every one waits in the queue while the first batch runs
    model.let_go(1)
    assert model.started(2) == 11
    model.let_go(2)
    assert [future.result(timeout=60) for future in first] == [(1, 1)]
    assert sorted(future.result(timeout=60) for future in rest) == [(2, 11)] * 11


def test_a_full_queue_counts_the_requests_waiting_while_a_batch_runs(gated: Any) -> None:
    """Triton: with max_queue_size 8, while a batch of 8 runs, 8 of 10 more requests wait and 2 are refused."""
    model = gated("max_batch_size: 8\ndynamic_batching { default_queue_policy { max_queue_size: 8 } }\n")
    blocker = model.send(1)
    assert model.started(1) == 1
    eight = model.send(8)
    model.wait_pending(8)
    model.let_go(1)
    assert model.started(2) == 8  # a batch of 8 runs; the queue is empty
    ten = model.send(10)
    model.kit.wait_until(lambda: sum(future.done() for future in ten) == 2, "two requests to be refused",
                         deadline_s=20)
    model.wait_pending(8)
    refused = [future.exception(timeout=0) for future in ten if future.done()]
    assert all(isinstance(error, InferenceServerException) and error.status() == "503"
               and error.message() == "[request id: <id_unknown>] Exceeds maximum queue size" for error in refused)
    model.let_go(2)
    assert model.started(3) == 8
    model.let_go(3)
    assert [future.result(timeout=60) for future in blocker] == [(1, 1)]
    assert [future.result(timeout=60) for future in eight] == [(2, 8)] * 8
    assert sorted(future.result(timeout=60) for future in ten if future.exception(timeout=60) is None) == [(3, 8)] * 8
