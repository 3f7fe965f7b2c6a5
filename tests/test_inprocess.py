"""The in-process API (triton_serve.inprocess): sync, async and streaming calls, errors as over the
wire, a call after stop, and in-process and wire clients sharing one dynamic batcher."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.inprocess import Server, ServerError, Status
from triton_serve.testing import ToyBackendsPlugin, free_port, probe_config

from .conftest import ADD_SUB, REPEAT

ROW = np.arange(16, dtype=np.int32).reshape(1, 16)


@pytest.fixture
def start(add_model: Callable[..., Path], repo: Path) -> Iterator[Callable[..., Server]]:
    add_model("add_sub", ADD_SUB)
    add_model("repeat", REPEAT)
    started: list[Server] = []

    def make(repository: Path | None = repo, **options: Any) -> Server:
        options.setdefault("extra_plugins", [("toy", ToyBackendsPlugin())])
        server = Server(repository, **options)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def test_sync_infer_stream_and_facts(start: Callable[..., Server]) -> None:
    with start() as server:
        model = server.model("add_sub")
        outputs = model.infer({"INPUT0": ROW, "INPUT1": np.ones_like(ROW)})
        np.testing.assert_array_equal(outputs["OUTPUT0"], ROW + 1)
        np.testing.assert_array_equal(outputs["OUTPUT1"], ROW - 1)
        only = model.infer({"INPUT0": ROW, "INPUT1": ROW}, requested_outputs=["OUTPUT1"])
        assert list(only) == ["OUTPUT1"]
        counted = [int(o["OUTPUT0"][0]) for o in server.model("repeat").stream({"INPUT0": np.array([3], np.int32)},
                                                                                timeout=10)]
        assert counted == [0, 1, 2]
        assert {(m["name"], m["state"]) for m in server.models()} == {("add_sub", "READY"), ("repeat", "READY")}
        assert model.ready() and server.ready()
        assert model.metadata()["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
        assert model.config()["max_batch_size"] == 8
        stats = model.statistics()[0]["inference_stats"]
        assert stats["success"]["count"] == 2


def test_streaming_early_exit_cancels_and_infer_refuses_decoupled(start: Callable[..., Server]) -> None:
    with start() as server:
        stream = server.model("repeat").stream({"INPUT0": np.array([5], np.int32)}, timeout=10)
        assert int(next(stream)["OUTPUT0"][0]) == 0
        stream.close()  # leaving early: no hang, the server goes on
        with pytest.raises(ServerError, match="decoupled") as refused:
            server.model("repeat").infer({"INPUT0": np.array([1], np.int32)})
        assert refused.value.status is Status.UNSUPPORTED
        assert server.model("add_sub").infer({"INPUT0": ROW, "INPUT1": ROW})["OUTPUT0"].sum() == 2 * ROW.sum()


def test_errors_are_the_wire_errors(start: Callable[..., Server]) -> None:
    http_port = free_port()
    with start().start(http_port=http_port) as server:
        client = httpclient.InferenceServerClient(server.http_url())
        cases = [{"INPUTX": ROW, "INPUT1": ROW}, {"INPUT0": ROW.astype(np.float32), "INPUT1": ROW}]
        for inputs in cases:
            with pytest.raises(ServerError) as raised:
                server.model("add_sub").infer(inputs)
            wire_inputs = []
            for name, array in inputs.items():
                tensor = httpclient.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT32")
                tensor.set_data_from_numpy(array)
                wire_inputs.append(tensor)
            with pytest.raises(InferenceServerException) as over_http:
                client.infer("add_sub", wire_inputs)
            assert raised.value.status is Status.INVALID_ARG
            assert str(raised.value) == over_http.value.message()
        with pytest.raises(ServerError, match="unknown model|not found"):
            server.model("nothing").infer({"INPUT0": ROW})


def test_after_stop_calls_raise(start: Callable[..., Server]) -> None:
    server = start().start()
    model = server.model("add_sub")
    server.stop()
    server.stop()  # again: nothing
    for call in (lambda: model.infer({"INPUT0": ROW, "INPUT1": ROW}), server.models,
                 lambda: list(server.model("repeat").stream({"INPUT0": np.array([1], np.int32)}))):
        with pytest.raises(ServerError, match="stopped") as raised:
            call()
        assert raised.value.status is Status.UNAVAILABLE
    assert not server.ready()
    with pytest.raises(ServerError, match="already started"):
        server.start()


def test_async_use(start: Callable[..., Server]) -> None:
    async def main() -> tuple[Any, list[int], Any]:
        async with start() as server:
            model = server.model("add_sub")
            together = await asyncio.gather(*(model.async_infer({"INPUT0": ROW * i, "INPUT1": ROW})
                                              for i in range(4)))
            counted = [int(o["OUTPUT0"][0]) async for o in
                       server.model("repeat").async_stream({"INPUT0": np.array([4], np.int32)})]
            return together, counted, server
    together, counted, server = asyncio.run(asyncio.wait_for(main(), 60))
    for i, outputs in enumerate(together):
        np.testing.assert_array_equal(outputs["OUTPUT0"], ROW * i + ROW)
    assert counted == [0, 1, 2, 3]
    assert not server.is_running


def test_load_and_unload_without_a_repository(start: Callable[..., Server]) -> None:
    with start(None) as server:
        assert server.models() == []
        config = {"name": "fresh", "backend": "toy_add_sub", "max_batch_size": 8,
                  "input": [{"name": f"INPUT{i}", "data_type": "TYPE_INT32", "dims": [16]} for i in (0, 1)],
                  "output": [{"name": f"OUTPUT{i}", "data_type": "TYPE_INT32", "dims": [16]} for i in (0, 1)]}
        server.load("fresh", config=config, files={"1/toy_add_sub.toy": b""})
        assert server.model("fresh").infer({"INPUT0": ROW, "INPUT1": ROW})["OUTPUT1"].sum() == 0
        server.unload("fresh")
        assert not server.model("fresh").ready()
        with pytest.raises(ServerError, match="unrecognized load parameter|backend"):
            server.load("broken", config={"name": "broken", "backend": "no_such_backend"}, files={"1/x": b""})


def test_in_process_and_wire_clients_share_one_dynamic_batcher(start: Callable[..., Server], repo: Path) -> None:
    (repo / "probe" / "1").mkdir(parents=True)
    (repo / "probe" / "config.pbtxt").write_text(
        probe_config(8) + "dynamic_batching { preferred_batch_size: [ 6 ] max_queue_delay_microseconds: 5000000 }")
    http_port, grpc_port = free_port(), free_port()
    with start().start(http_port=http_port, grpc_port=grpc_port) as server:
        model = server.model("probe")
        batches: list[int] = []
        row = np.zeros((1, 1), np.float32)

        def in_process() -> None:
            batches.append(int(model.infer({"INPUT0": row}, timeout=30)["BATCH"][0, 0]))

        def over_http() -> None:
            tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
            tensor.set_data_from_numpy(row)
            result = httpclient.InferenceServerClient(server.http_url(), network_timeout=30).infer("probe", [tensor])
            batches.append(int(result.as_numpy("BATCH")[0, 0]))

        def over_grpc() -> None:
            tensor = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
            tensor.set_data_from_numpy(row)
            result = grpcclient.InferenceServerClient(server.grpc_url()).infer("probe", [tensor], client_timeout=30)
            batches.append(int(result.as_numpy("BATCH")[0, 0]))

        threads = [threading.Thread(target=call) for call in (in_process, over_http, over_grpc) * 2]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(40)
        assert batches == [6] * 6  # one batch of six: two requests from each kind of client
        stats = model.statistics()[0]
        assert stats["inference_count"] == 6 and stats["execution_count"] == 1
        assert stats["batch_stats"][0]["batch_size"] == 6
