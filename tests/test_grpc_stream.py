"""ModelStreamInfer with tritonclient.grpc (start_stream / async_stream_infer and aio), cancellation, stop."""
from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from triton_serve._engine.backend import Backend, InstanceSpec, Model, ModelInstance, ModelSpec
from triton_serve._engine.errors import ServerError, Status
from triton_serve._engine.hookspecs import hookimpl
from triton_serve._engine.inference import InferenceRequest, InferenceResponse, Tensor
from triton_serve._engine.registry import BackendRegistry

from .conftest import ADD_SUB, FRONTEND_MODES
from .test_grpc import FAILING, REPEAT


@pytest.fixture(params=FRONTEND_MODES, ids=lambda count: f"frontend_processes={count}")
def frontend_processes(request: pytest.FixtureRequest) -> int:
    """Every test here runs with in-process front-ends and with two front-end processes."""
    return int(request.param)


IDENTITY = """
backend: "toy_identity"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }
output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }
"""
SLOW = IDENTITY + 'parameters { key: "delay_s" value { string_value: "0.3" } }\n'
Result = tuple[Any, Any]  # (InferResult | None, InferenceServerException | None), as tritonclient calls back


class _Callbacks:
    """Collects stream callbacks from tritonclient's reader thread."""

    def __init__(self) -> None:
        self.results: queue.Queue[Result] = queue.Queue()

    def __call__(self, result: Any, error: Any) -> None:
        self.results.put((result, error))

    def take(self, count: int) -> list[Result]:
        return [self.results.get(timeout=30) for _ in range(count)]


@pytest.fixture
def server(add_model, toy_server):  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("repeat", REPEAT)
    add_model("failing", FAILING)
    add_model("identity", IDENTITY)
    add_model("slow", SLOW)
    return toy_server()


@pytest.fixture
def client(server) -> Iterator[grpcclient.InferenceServerClient]:  # type: ignore[no-untyped-def]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        yield client


def _int_input(value: int, name: str = "INPUT0") -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput(name, [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [tensor]


def _add_sub_inputs() -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs


def _final_flag(result: Any) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def test_responses_carry_request_ids_in_order(client) -> None:  # type: ignore[no-untyped-def]
    callbacks = _Callbacks()
    client.start_stream(callbacks)
    client.async_stream_infer("slow", _int_input(1), request_id="slow")
    for i in range(4):
        client.async_stream_infer("add_sub", _add_sub_inputs(), request_id=f"fast-{i}")
    results = callbacks.take(5)
    client.stop_stream()
    assert all(error is None for _, error in results)
    assert [r.get_response().id for r, _ in results] == ["slow", "fast-0", "fast-1", "fast-2", "fast-3"]
    assert all(_final_flag(r) for r, _ in results)
    assert results[0][0].as_numpy("OUTPUT0").tolist() == [1]
    assert results[1][0].as_numpy("OUTPUT0").tolist() == [[i + 1 for i in range(16)]]


def test_decoupled_model_streams_every_response(client) -> None:  # type: ignore[no-untyped-def]
    callbacks = _Callbacks()
    client.start_stream(callbacks)
    client.async_stream_infer("repeat", _int_input(3), request_id="r1")
    results = callbacks.take(3)
    assert [(r.get_response().id, r.as_numpy("OUTPUT0").tolist(), _final_flag(r)) for r, _ in results] == \
        [("r1", [0], False), ("r1", [1], False), ("r1", [2], False)]
    client.async_stream_infer("repeat", _int_input(2), request_id="r2", enable_empty_final_response=True)
    results = callbacks.take(3)
    client.stop_stream()
    assert [r.as_numpy("OUTPUT0").tolist() for r, _ in results[:2]] == [[0], [1]]
    final = results[2][0].get_response()
    assert (final.id, final.model_name, len(final.outputs), _final_flag(results[2][0])) == ("r2", "repeat", 0, True)
    assert callbacks.results.empty()


def test_errors_arrive_in_error_message_and_the_stream_stays_open(client) -> None:  # type: ignore[no-untyped-def]
    callbacks = _Callbacks()
    client.start_stream(callbacks)
    client.async_stream_infer("failing", _int_input(1), request_id="a")
    client.async_stream_infer("missing", _int_input(1), request_id="b")
    client.async_stream_infer("add_sub", _add_sub_inputs()[:1], request_id="c")
    client.async_stream_infer("identity", _int_input(7), request_id="d")
    results = callbacks.take(4)
    client.stop_stream()
    errors = [str(error.message()) if error is not None else None for _, error in results]
    assert errors[:2] == ["toy_error model 'failing' always fails", "Request for unknown model: 'missing' is not found"]
    assert errors[2] is not None and errors[2].startswith("expected 2 inputs but got 1 inputs for model 'add_sub'")
    assert errors[3] is None and results[3][0].as_numpy("OUTPUT0").tolist() == [7]


def test_grpc_error_header_ends_the_stream_with_a_status(client) -> None:  # type: ignore[no-untyped-def]
    callbacks = _Callbacks()
    client.start_stream(callbacks, headers={"triton_grpc_error": "true"})
    client.async_stream_infer("identity", _int_input(5), request_id="ok")
    (result, error), = callbacks.take(1)
    assert error is None and result.as_numpy("OUTPUT0").tolist() == [5]
    client.async_stream_infer("failing", _int_input(1), request_id="bad")
    (result, error), = callbacks.take(1)
    assert result is None
    assert (error.status(), error.message()) == ("StatusCode.INTERNAL", "toy_error model 'failing' always fails")
    with pytest.raises(InferenceServerException, match="no longer in valid state"):
        client.async_stream_infer("identity", _int_input(5))
    client.stop_stream()
    assert client.is_server_ready()


def test_aio_stream_infer(server) -> None:  # type: ignore[no-untyped-def]
    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": "repeat", "inputs": _int_input(2), "request_id": "r"}
        yield {"model_name": "identity", "inputs": _int_input(9), "request_id": "i"}
        yield {"model_name": "failing", "inputs": _int_input(1), "request_id": "f"}

    async def run() -> list[tuple[str, Any]]:
        async with aioclient.InferenceServerClient(server.grpc_url) as client:
            seen = []
            async for result, error in client.stream_infer(requests()):
                seen.append(("error", error.message()) if error is not None else
                            (result.get_response().id, result.as_numpy("OUTPUT0").tolist()))
            return seen

    seen = asyncio.run(run())
    assert sorted(seen, key=str) == sorted([("r", [0]), ("r", [1]), ("i", [9]),
                                            ("error", "toy_error model 'failing' always fails")], key=str)


# ---- cancellation and shutdown, with a model the test holds -----------------------------------

STARTED_IDS: queue.Queue[str] = queue.Queue()
CANCELLED_IDS: queue.Queue[str] = queue.Queue()
GATE = threading.Event()


class _Gated(ModelInstance):
    """Reports each request as started, then holds it until the test opens GATE (answering like
    toy_identity) or the front-end cancels it."""

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse]:
        for request in requests:
            STARTED_IDS.put(request.id)
        while not GATE.is_set() and not all(request.cancelled.is_set() for request in requests):
            await asyncio.sleep(0.01)
        responses = []
        for request in requests:
            if request.cancelled.is_set():
                CANCELLED_IDS.put(request.id)
                responses.append(InferenceResponse.from_error(ServerError("cancelled", Status.CANCELLED)))
            else:
                tensor = request.inputs["INPUT0"]
                responses.append(InferenceResponse([Tensor("OUTPUT0", "INT32", tensor.shape, tensor.data)]))
        return responses


class _GatedModel(Model):
    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return _Gated(self, instance)


class _GatedBackend(Backend):
    name = "gated"

    def create_model(self, spec: ModelSpec) -> Model:
        return _GatedModel(self, spec)


class _GatedPlugin:
    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(_GatedBackend)


@pytest.fixture
def gated_server(add_model, tserve, toy_plugin, repo):  # type: ignore[no-untyped-def]
    add_model("gated", IDENTITY.replace("toy_identity", "gated"))
    add_model("identity", IDENTITY)
    GATE.clear()
    yield tserve(repo, extra_plugins=[("toy", toy_plugin), ("gated", _GatedPlugin())])
    GATE.set()  # let anything still held finish before the server stops


def test_cancelled_call_cancels_the_request(gated_server) -> None:  # type: ignore[no-untyped-def]
    with grpcclient.InferenceServerClient(gated_server.grpc_url) as client:
        callbacks = _Callbacks()
        call = client.async_infer("gated", _int_input(1), callbacks, request_id="unary")
        assert STARTED_IDS.get(timeout=30) == "unary"
        call.cancel()
        assert CANCELLED_IDS.get(timeout=30) == "unary"
        (result, error), = callbacks.take(1)
        assert result is None and error.status() == "StatusCode.CANCELLED"
        assert client.infer("identity", _int_input(3)).as_numpy("OUTPUT0").tolist() == [3]


def test_cancelled_stream_cancels_its_requests(gated_server) -> None:  # type: ignore[no-untyped-def]
    with grpcclient.InferenceServerClient(gated_server.grpc_url) as client:
        callbacks = _Callbacks()
        client.start_stream(callbacks)
        client.async_stream_infer("identity", _int_input(4), request_id="before")
        (result, _), = callbacks.take(1)
        assert result.as_numpy("OUTPUT0").tolist() == [4]
        client.async_stream_infer("gated", _int_input(1), request_id="streamed")
        assert STARTED_IDS.get(timeout=30) == "streamed"
        client.stop_stream(cancel_requests=True)
        assert CANCELLED_IDS.get(timeout=30) == "streamed"
        assert client.infer("identity", _int_input(3)).as_numpy("OUTPUT0").tolist() == [3]


def test_stop_refuses_new_requests_and_lets_open_streams_finish(gated_server) -> None:  # type: ignore[no-untyped-def]
    with grpcclient.InferenceServerClient(gated_server.grpc_url) as client:
        callbacks = _Callbacks()
        client.start_stream(callbacks)
        client.async_stream_infer("gated", _int_input(1), request_id="in-flight")
        assert STARTED_IDS.get(timeout=30) == "in-flight"

        async def stop_accepting() -> None:
            gated_server.server.request_stop()

        gated_server.call(stop_accepting)
        client.async_stream_infer("identity", _int_input(2), request_id="late")
        GATE.set()
        results = callbacks.take(2)
        client.stop_stream()
        assert results[0][0].get_response().id == "in-flight"
        assert results[0][0].as_numpy("OUTPUT0").tolist() == [1]
        assert results[1][1].message() == "GRPC server is shutting down and has stopped accepting new requests."
        with pytest.raises(InferenceServerException) as raised:
            client.is_server_live()
        assert raised.value.status() == "StatusCode.UNAVAILABLE"
