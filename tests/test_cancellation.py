"""Cancellation end to end: a client that leaves cancels its request; a queued one is dropped without running
and counts as failed with reason CANCELED; a running one sees ``request.cancelled``."""
from __future__ import annotations

import asyncio
import json
import queue
import re
import socket
import threading
import time
from collections.abc import Iterator, Sequence

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient

from triton_serve._engine.backend import Backend, InstanceSpec, Model, ModelInstance, ModelSpec
from triton_serve._engine.hookspecs import hookimpl
from triton_serve._engine.inference import InferenceRequest, InferenceResponse, Tensor
from triton_serve._engine.registry import BackendRegistry

from .conftest import FRONTEND_MODES

HELD = """
backend: "held"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }
output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }
instance_group { kind: KIND_CPU count: 1 }
"""
BATCHED = HELD.replace("max_batch_size: 0", "max_batch_size: 4\ndynamic_batching { }")
STREAMING = HELD.replace("max_batch_size: 0", "max_batch_size: 0\nmodel_transaction_policy { decoupled: true }")


class _Observed:
    """What the test watches: ids of requests executed and of requests the server cancelled; the gate
    that holds every execution until opened (or its requests are cancelled)."""

    def __init__(self) -> None:
        self.executed: queue.Queue[str] = queue.Queue()
        self.cancelled: queue.Queue[str] = queue.Queue()
        self.gate = threading.Event()


OBSERVED = _Observed()


class _Held(ModelInstance):
    def __init__(self, model: Model, spec: InstanceSpec) -> None:
        super().__init__(model, spec)
        self.decoupled = model.spec.config.model_transaction_policy.decoupled

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse] | None:
        for request in requests:
            OBSERVED.executed.put(request.id)
        if self.decoupled:  # one response at once, the rest once the gate opens
            for request in requests:
                request.send(InferenceResponse([_echo(request)]), final=False)
        while not OBSERVED.gate.is_set() and not all(r.cancelled.is_set() for r in requests):
            await asyncio.sleep(0.01)
        if self.decoupled:
            for request in requests:
                request.send(None, final=True)
            return None
        return [InferenceResponse([_echo(request)]) for request in requests]


def _echo(request: InferenceRequest) -> Tensor:
    data = request.inputs["INPUT0"].data
    return Tensor("OUTPUT0", "INT32", data.shape, data)


class _HeldPlugin:
    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(_HeldBackend)


class _HeldModel(Model):
    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return _Held(self, instance)


class _HeldBackend(Backend):
    name = "held"

    def create_model(self, spec: ModelSpec) -> Model:
        return _HeldModel(self, spec)


@pytest.fixture(params=FRONTEND_MODES, ids=lambda count: f"frontend_processes={count}")
def frontend_processes(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def server(add_model, tserve, toy_plugin, repo, frontend_processes, http_server, monkeypatch):  # type: ignore[no-untyped-def]
    """A server with the held models; every request the server cancels is reported in OBSERVED.cancelled."""
    global OBSERVED
    OBSERVED = _Observed()
    cancel = InferenceRequest.cancel

    def reporting_cancel(request: InferenceRequest) -> None:
        if not request.cancelled.is_set():
            OBSERVED.cancelled.put(request.id)
        cancel(request)

    monkeypatch.setattr(InferenceRequest, "cancel", reporting_cancel)
    add_model("held", HELD)
    add_model("held_batched", BATCHED)
    add_model("streaming", STREAMING)
    yield tserve(repo, extra_plugins=[("toy", toy_plugin), ("held", _HeldPlugin())],
                 frontend_processes=frontend_processes, http_server=http_server)
    OBSERVED.gate.set()


def _wait_for(expected: str, found: queue.Queue[str]) -> None:
    assert found.get(timeout=30) == expected


def _pending(server, model: str = "held") -> int:  # type: ignore[no-untyped-def]
    text = httpx.get(server.metrics_url).text
    match = re.search(rf'nv_inference_pending_request_count\{{model="{model}",version="1"\}} (\S+)', text)
    return int(float(match[1])) if match else 0


def _wait_queued(server, count: int, model: str = "held") -> None:  # type: ignore[no-untyped-def]
    for _ in range(3000):
        if _pending(server, model) == count:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{count} requests never waited in the queue")


def _failures(server, model: str = "held") -> dict[str, int]:  # type: ignore[no-untyped-def]
    text = httpx.get(server.metrics_url).text
    return {reason: int(float(value)) for reason, value in re.findall(
        rf'nv_inference_request_failure\{{model="{model}",reason="(\w+)",version="1"\}} (\S+)', text)}


@pytest.fixture
def model() -> str:
    """The held model the blocker and the test use."""
    return "held"


@pytest.fixture
def blocker(server, model) -> Iterator[queue.Queue]:  # type: ignore[no-untyped-def,type-arg]
    """A request that holds the model's one instance until the test opens the gate; its result comes
    on the queue."""
    results: queue.Queue = queue.Queue()  # type: ignore[type-arg]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.async_infer(model, _inputs(grpcclient, 1, model), lambda result, error: results.put(result or error),
                           request_id="blocker")
        _wait_for("blocker", OBSERVED.executed)
        yield results


def _inputs(module, value: int, model: str = "held"):  # type: ignore[no-untyped-def]
    shape = [1, 1] if model == "held_batched" else [1]
    tensor = module.InferInput("INPUT0", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, value, np.int32))
    return [tensor]


def _finish(server, blocker, model: str = "held") -> None:  # type: ignore[no-untyped-def]
    """Open the gate; the blocker and one later request run, the cancelled ones never did."""
    OBSERVED.gate.set()
    assert blocker.get(timeout=30).as_numpy("OUTPUT0").ravel().tolist() == [1]
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer(model, _inputs(httpclient, 5, model), request_id="after")
        assert result.as_numpy("OUTPUT0").ravel().tolist() == [5]
    executed = [OBSERVED.executed.get_nowait() for _ in range(OBSERVED.executed.qsize())]
    assert executed == ["after"]


def _http_post(server, path: str, body: dict) -> socket.socket:  # type: ignore[no-untyped-def,type-arg]
    """Send a whole POST on a raw connection and leave it open (the test closes it)."""
    payload = json.dumps(body).encode()
    host, port = server.http_url.split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


@pytest.mark.parametrize("model", ["held", "held_batched"])  # the default scheduler, the dynamic batcher's queue
def test_http_client_that_leaves_drops_its_queued_request(server, blocker, model) -> None:  # type: ignore[no-untyped-def]
    shape = [1, 1] if model == "held_batched" else [1]
    body = {"id": "gone", "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": shape, "data": [2]}]}
    sock = _http_post(server, f"/v2/models/{model}/infer", body)
    _wait_queued(server, 1, model)
    sock.close()
    _wait_for("gone", OBSERVED.cancelled)
    _finish(server, blocker, model)
    stats = httpx.get(f"http://{server.http_url}/v2/models/{model}/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == 1 and stats["inference_stats"]["success"]["count"] == 2
    assert stats["execution_count"] == 2
    assert _failures(server, model)["CANCELED"] == 1


@pytest.mark.parametrize("http_server", ["uvicorn", "hypercorn"])
def test_generate_client_that_leaves_drops_its_queued_request(server, blocker) -> None:  # type: ignore[no-untyped-def]
    sock = _http_post(server, "/v2/models/held/generate", {"INPUT0": 3, "id": "generated"})
    _wait_queued(server, 1)
    sock.close()
    _wait_for("generated", OBSERVED.cancelled)
    _finish(server, blocker)
    assert _failures(server)["CANCELED"] == 1


def test_grpc_cancelled_calls_drop_their_queued_requests(server, blocker) -> None:  # type: ignore[no-untyped-def]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        call = client.async_infer("held", _inputs(grpcclient, 2), lambda result, error: None, request_id="unary")
        _wait_queued(server, 1)
        call.cancel()
        _wait_for("unary", OBSERVED.cancelled)

        async def aio_call() -> None:
            async with aioclient.InferenceServerClient(server.grpc_url) as aio:
                task = asyncio.create_task(aio.infer("held", _inputs(aioclient, 3), request_id="aio"))
                while _pending(server) != 2:  # the cancelled unary call's request still waits
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        asyncio.run(aio_call())
        _wait_for("aio", OBSERVED.cancelled)

        client.start_stream(lambda result, error: None)
        client.async_stream_infer("held", _inputs(grpcclient, 4), request_id="streamed")
        _wait_queued(server, 3)
        client.stop_stream(cancel_requests=True)
        _wait_for("streamed", OBSERVED.cancelled)
    _finish(server, blocker)
    assert _failures(server)["CANCELED"] == 3


@pytest.mark.parametrize("http_server", ["uvicorn", "hypercorn"])
def test_http_clients_that_leave_cancel_their_running_requests(server) -> None:  # type: ignore[no-untyped-def]
    """The models hold their requests (the streaming one after one token): clients that leave mid-way
    cancel them, the running models see it, and the server carries on."""
    body = {"id": "running", "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [6]}]}
    sock = _http_post(server, "/v2/models/held/infer", body)
    _wait_for("running", OBSERVED.executed)
    sock.close()
    _wait_for("running", OBSERVED.cancelled)
    url = f"http://{server.http_url}/v2/models/streaming/generate_stream"
    with httpx.stream("POST", url, json={"INPUT0": 7, "id": "sse"}) as reply:
        first = next(reply.iter_lines())
        assert json.loads(first[len("data: "):])["OUTPUT0"] == 7
    _wait_for("sse", OBSERVED.cancelled)
    OBSERVED.gate.set()
    reply = httpx.post(url, json={"INPUT0": 8})
    assert reply.text == 'data: {"OUTPUT0":8,"model_name":"streaming","model_version":"1"}\n\n'


def test_a_stream_past_its_in_flight_limit_is_held_back_and_loses_nothing(server, blocker) -> None:  # type: ignore[no-untyped-def]
    """A client that streams requests faster than the model answers: the server takes MAX_IN_FLIGHT of them and
    reads no more (flow control holds the rest at the client) until some are answered; then every one is."""
    from triton_serve._engine.frontend.grpc.stream import MAX_IN_FLIGHT

    sent = MAX_IN_FLIGHT + 100
    results: queue.Queue = queue.Queue()  # type: ignore[type-arg]
    stopped = False
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: results.put(error or result))
        try:
            for index in range(sent):
                client.async_stream_infer("held", _inputs(grpcclient, index), request_id=f"s{index}")
            for _ in range(3000):
                if _pending(server) >= MAX_IN_FLIGHT:
                    break
                threading.Event().wait(0.01)
            threading.Event().wait(0.5)  # time for any request past the limit to arrive
            assert _pending(server) == MAX_IN_FLIGHT
            OBSERVED.gate.set()
            deadline = time.monotonic() + 120
            answers = [results.get(timeout=max(deadline - time.monotonic(), 0.01)) for _ in range(sent)]
            stopping = threading.Thread(target=client.stop_stream)  # returns once the stream has ended
            stopping.start()
            stopping.join(60)
            stopped = not stopping.is_alive()
            assert stopped, "the stream did not end"
        finally:
            OBSERVED.gate.set()
            if not stopped:  # a failure: end the stream now (cancelled), not once every request is answered
                client.stop_stream(cancel_requests=True)
    assert blocker.get(timeout=30).as_numpy("OUTPUT0").ravel().tolist() == [1]
    assert sorted(int(answer.as_numpy("OUTPUT0")[0]) for answer in answers) == list(range(sent))
    assert _pending(server) == 0
