"""An exception nobody meant to raise (a backend, scheduler or front-end bug) answers like any error:
HTTP 500 with Triton's ``{"error": ...}`` JSON body, gRPC INTERNAL, the same message, logged once with
its traceback; the connection and the server carry on."""
from __future__ import annotations

import json
import logging
import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve._engine.dataplane import DataPlane
from triton_serve._engine.frontend.http import generate
from triton_serve.plugin import InferenceRequest, Scheduler, SchedulerRegistry, hookimpl
from triton_serve.testing import RunningServer, ToyBackendsPlugin

from .conftest import ADD_SUB, FRONTEND_MODES

CRASH_MESSAGE = "RuntimeError: toy_crash model 'crash' always crashes"
SCHEDULER_BUG = "RuntimeError: the scheduler tripped over its own feet"
ROUTE_BUG = "RuntimeError: the front-end tripped over its own feet"
REPEAT = ("backend: \"toy_repeat\"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n"
          "input { name: \"INPUT0\" data_type: TYPE_INT32 dims: [ 1 ] }\n"
          "output { name: \"OUTPUT0\" data_type: TYPE_INT32 dims: [ 1 ] }\n")
GENERATE_BODY = {"INPUT0": [1] * 16, "INPUT1": [1] * 16}
AddModel = Callable[..., Path]  # conftest's add_model
ToyServer = Callable[..., RunningServer]  # conftest's toy_server


@pytest.fixture(params=FRONTEND_MODES, ids=lambda count: f"frontend_processes={count}")
def frontend_processes(request: pytest.FixtureRequest) -> int:
    """Every test here runs with in-process front-ends and with two front-end processes."""
    return int(request.param)


class _TrippingScheduler(Scheduler):
    """The ``default`` scheduler with a bug: it raises on every request."""

    def enqueue(self, request: InferenceRequest) -> None:
        raise RuntimeError("the scheduler tripped over its own feet")


class _TrippingSchedulerPlugin:
    @hookimpl
    def tserve_register_schedulers(self, registry: SchedulerRegistry) -> None:
        registry.add("default", _TrippingScheduler)


def _infer_body() -> dict[str, Any]:
    return {"inputs": [{"name": name, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
                       for name in ("INPUT0", "INPUT1")]}


def _grpc_inputs() -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs


def _http_inputs() -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs


def assert_json_error(response: httpx.Response, status: int, message: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"error": message}


def tracebacks(caplog: pytest.LogCaptureFixture, text: str) -> int:
    """How many log records carry the traceback of an exception whose message holds ``text``."""
    return sum(1 for record in caplog.records if record.exc_info and text in str(record.exc_info[1]))


def grpc_stream_error(url: str, model: str, inputs: list[grpcclient.InferInput]) -> str:
    """The error message that answers one ModelStreamInfer request."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, inputs)
        _result, error = results.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    assert error is not None
    return str(error.message())


def test_a_backend_exception_in_execute_is_an_internal_error(add_model: AddModel, toy_server: ToyServer,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    add_model("crash", ADD_SUB.replace("toy_add_sub", "toy_crash"))
    server = toy_server()
    url = f"http://{server.http_url}"
    with pytest.raises(InferenceServerException) as raised:
        httpclient.InferenceServerClient(server.http_url).infer("crash", _http_inputs())
    assert (raised.value.status(), raised.value.message()) == ("500", CRASH_MESSAGE)
    with httpx.Client(base_url=url) as client:
        assert_json_error(client.post("/v2/models/crash/infer", json=_infer_body()), 500, CRASH_MESSAGE)
        assert_json_error(client.post("/v2/models/crash/generate", json=GENERATE_BODY), 500, CRASH_MESSAGE)
        streamed = client.post("/v2/models/crash/generate_stream", json=GENERATE_BODY)
        assert streamed.status_code == 500
        assert streamed.text == 'data: {"error":"%s"}\n\n' % CRASH_MESSAGE
    with pytest.raises(InferenceServerException) as raised:
        grpcclient.InferenceServerClient(server.grpc_url).infer("crash", _grpc_inputs())
    assert (raised.value.status(), raised.value.message()) == ("StatusCode.INTERNAL", CRASH_MESSAGE)
    assert grpc_stream_error(server.grpc_url, "crash", _grpc_inputs()) == CRASH_MESSAGE
    assert tracebacks(caplog, "always crashes") == 6  # once per request


def test_a_backend_exception_in_load_fails_the_load_and_logs_its_traceback(
        add_model: AddModel, toy_server: ToyServer, caplog: pytest.LogCaptureFixture) -> None:
    """As Triton: a load that fails is INVALID_ARGUMENT (400) saying why, whatever the reason."""
    add_model("crashing", ADD_SUB + 'parameters { key: "crash_load" value { string_value: "1" } }')
    server = toy_server(model_control_mode="explicit")
    message = ("load failed for model 'crashing': version 1 is at UNAVAILABLE state: "
               "RuntimeError: toy model 'crashing' crashed while loading;")
    response = httpx.post(f"http://{server.http_url}/v2/repository/models/crashing/load")
    assert_json_error(response, 400, message)
    assert tracebacks(caplog, "crashed while loading") == 1
    with pytest.raises(InferenceServerException) as raised:
        httpclient.InferenceServerClient(server.http_url).load_model("crashing")
    assert (raised.value.status(), raised.value.message()) == ("400", message)
    with pytest.raises(InferenceServerException) as raised:
        grpcclient.InferenceServerClient(server.grpc_url).load_model("crashing")
    assert (raised.value.status(), raised.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)
    assert tracebacks(caplog, "crashed while loading") == 3


def test_a_scheduler_exception_is_an_internal_error(add_model: AddModel, tserve: Callable[..., RunningServer],
                                                    toy_plugin: ToyBackendsPlugin, repo: Path,
                                                    frontend_processes: int,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    add_model("add_sub", ADD_SUB)
    server = tserve(repo, frontend_processes=frontend_processes,
                    extra_plugins=[("toy", toy_plugin), ("tripping", _TrippingSchedulerPlugin())])
    with httpx.Client(base_url=f"http://{server.http_url}") as client:
        assert_json_error(client.post("/v2/models/add_sub/infer", json=_infer_body()), 500, SCHEDULER_BUG)
        assert_json_error(client.post("/v2/models/add_sub/generate", json=GENERATE_BODY), 500, SCHEDULER_BUG)
        assert client.get("/v2/health/ready").status_code == 200  # the same connection, still served
    with pytest.raises(InferenceServerException) as raised:
        httpclient.InferenceServerClient(server.http_url).infer("add_sub", _http_inputs())
    assert (raised.value.status(), raised.value.message()) == ("500", SCHEDULER_BUG)
    with pytest.raises(InferenceServerException) as raised:
        grpcclient.InferenceServerClient(server.grpc_url).infer("add_sub", _grpc_inputs())
    assert (raised.value.status(), raised.value.message()) == ("StatusCode.INTERNAL", SCHEDULER_BUG)
    assert grpc_stream_error(server.grpc_url, "add_sub", _grpc_inputs()) == SCHEDULER_BUG
    assert tracebacks(caplog, "tripped over its own feet") == 5  # once per request


def test_a_front_end_exception_is_a_json_500(add_model: AddModel, toy_server: ToyServer,
                                             monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    add_model("add_sub", ADD_SUB)

    async def tripping(*args: Any) -> Any:
        raise RuntimeError("the front-end tripped over its own feet")

    monkeypatch.setattr(DataPlane, "model_metadata", tripping)
    server = toy_server()
    with httpx.Client(base_url=f"http://{server.http_url}") as client:
        assert_json_error(client.get("/v2/models/add_sub"), 500, ROUTE_BUG)
        assert_json_error(client.post("/v2/models/add_sub/generate", json=GENERATE_BODY), 500, ROUTE_BUG)
        assert client.get("/v2/models/add_sub/ready").status_code == 200  # the same connection, still served
    with pytest.raises(InferenceServerException) as raised:
        httpclient.InferenceServerClient(server.http_url).get_model_metadata("add_sub")
    assert (raised.value.status(), raised.value.message()) == ("500", ROUTE_BUG)
    with pytest.raises(InferenceServerException) as raised:
        grpcclient.InferenceServerClient(server.grpc_url).get_model_metadata("add_sub")
    assert (raised.value.status(), raised.value.message()) == ("StatusCode.INTERNAL", ROUTE_BUG)
    assert tracebacks(caplog, "tripped over its own feet") == 4  # once per request


@pytest.mark.parametrize("frontend_processes", [0], ids=["frontend_processes=0"])
def test_an_exception_mid_stream_ends_the_event_stream_with_the_error(
        add_model: AddModel, toy_server: ToyServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, frontend_processes: int) -> None:
    """The response has started (200, an event stream): its last event is the error, and the stream
    ends properly rather than with a dropped connection."""
    add_model("repeat", REPEAT)
    encoded: list[int] = []
    encode = generate.generate_response

    def encode_once(*args: Any) -> Any:
        encoded.append(1)
        if len(encoded) > 1:
            raise RuntimeError("the front-end tripped over its own feet")
        return encode(*args)

    monkeypatch.setattr(generate, "generate_response", encode_once)
    server = toy_server()
    with httpx.Client(base_url=f"http://{server.http_url}") as client:
        response = client.post("/v2/models/repeat/generate_stream", json={"INPUT0": [3]})
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line.removeprefix("data: ")) for line in response.text.split("\n\n") if line]
        assert events == [{"model_name": "repeat", "model_version": "1", "OUTPUT0": 0}, {"error": ROUTE_BUG}]
        assert client.get("/v2/health/live").status_code == 200  # the same connection, still served
    assert tracebacks(caplog, "tripped over its own feet") == 1


@pytest.fixture(autouse=True)
def _capture_errors(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
