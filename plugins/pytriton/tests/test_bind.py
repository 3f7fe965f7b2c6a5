"""Binding functions: results checked, errors reported, async and generator functions, the decorators,
process isolation, and what bind refuses."""
from __future__ import annotations

import asyncio
import importlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.inprocess import ServerError, Status
from triton_serve.testing import free_port
from triton_serve_pytriton.decorators import (batch, fill_optionals, first_value, group_by_keys, group_by_values,
                                              pad_batch, sample, triton_context)
from triton_serve_pytriton.exceptions import (PyTritonBadParameterError, PyTritonInvalidOperationError,
                                              PyTritonUnrecoverableError, PyTritonValidationError)
from triton_serve_pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from triton_serve_pytriton.triton import Triton, TritonConfig

VALUE = [Tensor(name="value", dtype=np.float32, shape=(1,))]
RESULT = [Tensor(name="result", dtype=np.float32, shape=(1,))]


@pytest.fixture
def triton() -> Iterator[Triton]:
    with Triton(config=TritonConfig(http_address="127.0.0.1", http_port=free_port(), allow_grpc=False,
                                    allow_metrics=False)) as running:
        yield running


def infer(triton: Triton, model: str, **inputs: Any) -> dict[str, np.ndarray]:
    return triton.server.model(model).infer(inputs, timeout=30)


def test_a_raising_function_fails_its_request_and_the_server_goes_on(triton: Triton) -> None:
    @batch
    def picky(value: np.ndarray) -> dict[str, np.ndarray]:
        if (value < 0).any():
            raise ValueError("negative values are not welcome")
        return {"result": value}

    triton.bind("picky", picky, VALUE, RESULT)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{triton.config.http_port}")
    tensor = httpclient.InferInput("value", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[-1]], np.float32))
    with pytest.raises(InferenceServerException, match="ValueError: negative values are not welcome"):
        client.infer("picky", [tensor])
    tensor.set_data_from_numpy(np.array([[2]], np.float32))
    assert client.infer("picky", [tensor]).as_numpy("result")[0, 0] == 2
    client.close()


@pytest.mark.parametrize("returned, strict, message", [
    (lambda v: {"result": np.array([[b"x"]] * len(v), dtype=object)}, False, "`result`.*invalid type"),
    (lambda v: {}, False, "returned no output 'result'"),
    (lambda v: {"result": v.reshape(-1)}, True, "`result`.*invalid shapes"),
    (lambda v: {"result": v, "extra": v}, True, "`extra` is not defined"),
    (lambda v: {"result": v.tolist()}, False, "output 'result' as list"),
])
def test_wrong_results_name_the_output(triton: Triton, returned: Callable[[np.ndarray], Any], strict: bool,
                                       message: str) -> None:
    triton.bind("wrong", batch(lambda value: returned(value)), VALUE, RESULT, strict=strict)
    with pytest.raises(ServerError, match=message):
        infer(triton, "wrong", value=np.ones((1, 1), np.float32))


def test_results_are_cast_to_the_declared_type_unless_strict(triton: Triton) -> None:
    triton.bind("lenient", batch(lambda value: {"result": value.astype(np.float64) * 2, "ignored": value}),
                VALUE, RESULT)
    outputs = infer(triton, "lenient", value=np.ones((2, 1), np.float32))
    assert outputs["result"].dtype == np.float32 and list(outputs) == ["result"]
    triton.bind("strict", batch(lambda value: {"result": value.astype(np.float64)}), VALUE, RESULT, strict=True)
    with pytest.raises(ServerError, match="invalid type"):
        infer(triton, "strict", value=np.ones((1, 1), np.float32))


def test_bind_refuses(triton: Triton) -> None:
    identity = batch(lambda value: {"result": value})
    triton.bind("once", identity, VALUE, RESULT)
    with pytest.raises(PyTritonInvalidOperationError, match="same name twice"):
        triton.bind("once", identity, VALUE, RESULT)
    with pytest.raises(PyTritonValidationError, match="Model name can only contain"):
        triton.bind("a/b", identity, VALUE, RESULT)
    with pytest.raises(PyTritonValidationError, match="cannot be optional"):
        triton.bind("opt", identity, VALUE, [Tensor(name="r", dtype=np.float32, shape=(1,), optional=True)])
    with pytest.raises(PyTritonBadParameterError, match="cannot be pickled|not importable"):
        triton.bind("isolated_lambda", lambda requests: [], VALUE, RESULT, process_isolation=True)
    assert triton.server.model("once").ready()


def test_process_isolation_runs_the_function_in_a_worker(triton: Triton, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the worker imports the functions by name too
    isolated_functions = importlib.import_module("isolated_functions")
    pid = [Tensor(name="pid", dtype=np.int64, shape=(1,))]
    triton.bind("isolated", isolated_functions.process_id, VALUE, pid, process_isolation=True)
    worker = int(infer(triton, "isolated", value=np.ones((1, 1), np.float32))["pid"][0, 0])
    assert worker != os.getpid()
    triton.bind("isolated_stream", isolated_functions.countdown, VALUE, pid,
                config=ModelConfig(decoupled=True), process_isolation=True)
    stream = triton.server.model("isolated_stream").stream({"value": np.full((1, 1), 3, np.float32)}, timeout=30)
    assert [int(o["pid"][0, 0]) for o in stream] == [3, 2, 1]


def test_results_from_a_worker_are_checked_there_and_cross_as_content(triton: Triton,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    isolated_functions = importlib.import_module("isolated_functions")
    pid = [Tensor(name="pid", dtype=np.int64, shape=(1,))]
    triton.bind("greeting", isolated_functions.greeting, VALUE, [Tensor(name="text", dtype=bytes, shape=(1,))],
                process_isolation=True)
    texts = infer(triton, "greeting", value=np.array([[1], [2]], np.float32))["text"]
    assert texts.ravel().tolist() == [b"hello 1", b"hello 2"]
    triton.bind("not_a_list", isolated_functions.not_a_list, VALUE, pid, process_isolation=True)
    with pytest.raises(ServerError, match=r"^Outputs returned by `not_a_list` model callable must be list") as raised:
        infer(triton, "not_a_list", value=np.ones((1, 1), np.float32))
    assert raised.value.status is Status.INTERNAL
    triton.bind("with_a_note", isolated_functions.with_a_note, VALUE, pid, process_isolation=True)
    assert infer(triton, "with_a_note", value=np.ones((1, 1), np.float32))["pid"].tolist() == [[7]]  # checked in the worker
    triton.bind("wrong_type", isolated_functions.wrong_type, VALUE, pid, process_isolation=True)
    with pytest.raises(ServerError, match="Returned output `pid` for model `wrong_type` has invalid type"):
        infer(triton, "wrong_type", value=np.ones((1, 1), np.float32))


def test_async_and_generator_functions(triton: Triton) -> None:
    @batch
    async def doubled(value: np.ndarray) -> dict[str, np.ndarray]:
        await asyncio.sleep(0)
        return {"result": value * 2}

    async def counting(requests: list[Any]) -> Any:
        for step in range(3):
            await asyncio.sleep(0)
            yield [{"result": np.array([[step]], np.float32)} for _ in requests]

    triton.bind("async", doubled, VALUE, RESULT)
    triton.bind("async_stream", counting, VALUE, RESULT, config=ModelConfig(decoupled=True))
    assert infer(triton, "async", value=np.full((1, 1), 4, np.float32))["result"][0, 0] == 8
    stream = triton.server.model("async_stream").stream({"value": np.ones((1, 1), np.float32)}, timeout=30)
    assert [float(o["result"][0, 0]) for o in stream] == [0.0, 1.0, 2.0]


def test_several_functions_are_several_instances(triton: Triton) -> None:
    functions = [batch(lambda value, number=number: {"result": np.full_like(value, number)}) for number in range(3)]
    triton.bind("three", functions, VALUE, RESULT)
    assert triton.server.model("three").config()["instance_group"][0]["count"] == 3


def test_decorators(triton: Triton) -> None:
    text = [Tensor(name="text", dtype=bytes, shape=(1,))]

    @sample
    def one(value: np.ndarray) -> dict[str, np.ndarray]:
        return {"result": value + 1}

    triton.bind("sample", one, [Tensor(name="value", dtype=np.float32, shape=(2,))],
                [Tensor(name="result", dtype=np.float32, shape=(2,))], config=ModelConfig(batching=False))
    np.testing.assert_array_equal(infer(triton, "sample", value=np.zeros(2, np.float32))["result"], [1, 1])

    @fill_optionals(scale=np.array([3.0], np.float32))
    @group_by_keys
    @batch
    @first_value("scale")
    def scaled(value: np.ndarray, scale: float) -> dict[str, np.ndarray]:
        return {"result": value * scale}

    optional = VALUE + [Tensor(name="scale", dtype=np.float32, shape=(1,), optional=True)]
    triton.bind("optional", scaled, optional, RESULT)
    assert infer(triton, "optional", value=np.ones((1, 1), np.float32))["result"][0, 0] == 3
    assert infer(triton, "optional", value=np.ones((2, 1), np.float32),
                 scale=np.full((2, 1), 5, np.float32))["result"].ravel().tolist() == [5, 5]

    @batch
    @group_by_values("text")
    def lengths(text: np.ndarray) -> dict[str, np.ndarray]:
        assert len(set(text.ravel().tolist())) == 1  # one value per group
        return {"result": np.full((text.shape[0], 1), len(text[0, 0]), np.float32)}

    triton.bind("grouped", lengths, text, RESULT)
    words = np.array([[b"ab"], [b"abcd"], [b"ab"]], dtype=object)
    assert infer(triton, "grouped", text=words)["result"].ravel().tolist() == [2, 4, 2]

    @batch
    @pad_batch
    @triton_context
    def padded(value: np.ndarray, triton_context: Any) -> dict[str, np.ndarray]:
        assert triton_context.model_configs[padded].model_name == "padded"
        return {"result": np.full((value.shape[0], 1), value.shape[0], np.float32)[:value.shape[0]]}

    triton.bind("padded", padded, VALUE, RESULT, config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(
        preferred_batch_size=[4])))
    with pytest.raises(ServerError, match="batch size"):  # pad_batch made 4 rows out of 3: @batch says so
        infer(triton, "padded", value=np.ones((3, 1), np.float32))


def test_an_unrecoverable_error_stops_the_server(triton: Triton) -> None:
    def fatal(requests: list[Any]) -> list[Any]:
        raise PyTritonUnrecoverableError("the device is gone")

    triton.bind("fatal", fatal, VALUE, RESULT)
    with pytest.raises(ServerError, match="the device is gone"):
        infer(triton, "fatal", value=np.ones((1, 1), np.float32))
    deadline = time.monotonic() + 30
    while triton.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not triton.is_alive()


def test_the_clients_over_http_and_grpc() -> None:
    from triton_serve_pytriton.client import DecoupledModelClient, FuturesModelClient, ModelClient

    http_port, grpc_port = free_port(), free_port()
    config = TritonConfig(http_address="127.0.0.1", http_port=http_port, grpc_address="127.0.0.1",
                          grpc_port=grpc_port, allow_metrics=False)
    with Triton(config=config) as triton:
        triton.bind("double", batch(lambda value: {"result": value * 2}), VALUE, RESULT)
        triton.bind("count", countdown_function, VALUE, RESULT, config=ModelConfig(decoupled=True))
        configs = []
        for url in (f"http://127.0.0.1:{http_port}", f"grpc://127.0.0.1:{grpc_port}"):
            with ModelClient(url, "double", init_timeout_s=30) as client:
                assert client.infer_sample(np.array([3], np.float32))["result"].tolist() == [6]
                assert client.infer_batch(value=np.ones((2, 1), np.float32))["result"].shape == (2, 1)
                configs.append(client.model_config)
        assert configs[0] == configs[1]  # the same Triton JSON over both protocols, numbers as numbers
        assert configs[1]["input"][0]["dims"] == [1] and isinstance(configs[1]["max_batch_size"], int)
        with FuturesModelClient(f"127.0.0.1:{http_port}", "double", init_timeout_s=30) as futures:
            assert futures.infer_sample(np.array([1], np.float32)).result(30)["result"].tolist() == [2]
        with DecoupledModelClient(f"grpc://127.0.0.1:{grpc_port}", "count", init_timeout_s=30) as streaming:
            assert [int(o["result"][0]) for o in streaming.infer_sample(np.array([3], np.float32))] == [3, 2, 1]


def countdown_function(requests: list[Any]) -> Any:
    start = int(requests[0]["value"].ravel()[0])
    for number in range(start, 0, -1):
        yield [{"result": np.full((1, 1), number, np.float32)} for _ in requests]
