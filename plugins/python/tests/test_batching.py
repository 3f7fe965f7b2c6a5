"""Dynamic batching end to end: a batch reaches model.py in one execute call, and with ``stack_requests``
as one request with stacked inputs whose output rows go back to the right clients."""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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
