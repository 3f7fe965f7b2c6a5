"""Decoupled Python models and response senders, through tritonclient's gRPC streams and unary clients."""
from __future__ import annotations

import asyncio
import os
import queue
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer

# Triton's square_int32 example, as its users write it: a thread per request sends IN responses after
# execute returned, then the final flag.
SQUARE = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.inflight = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            with self.lock:
                self.inflight += 1
            threading.Thread(target=self.respond, args=(request.get_response_sender(), n), daemon=True).start()
        return None

    def respond(self, sender, n):
        for i in range(n):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            time.sleep(0.001)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self.lock:
            self.inflight -= 1

    def finalize(self):
        while self.inflight:
            time.sleep(0.01)
"""

# Decoupled misuse: each mode tries one mistake and keeps the error text, which "report" sends back.
MISUSE = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def message(text):
    return pb_utils.InferenceResponse([pb_utils.Tensor("MSG", np.array([text.encode()], dtype=object))])


class TritonPythonModel:
    def initialize(self, args):
        self.errors = []

    def execute(self, requests):
        request = requests[0]
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
        sender = request.get_response_sender()
        if mode == "return_list":
            return [message("not allowed")]
        if mode == "raise":
            sender.send(message("one"))
            raise pb_utils.TritonModelException("failed after one response")
        if mode == "pid":
            sender.send(message(str(os.getpid())))
            return None  # and never the final flag
        if mode == "report":
            sender.send(message(" | ".join(self.errors)), flags=FINAL)
            self.errors.clear()
            return None
        try:
            if mode == "after_final":
                sender.send(message("only"), flags=FINAL)
                sender.send(message("too late"))
            elif mode == "bad_flag":
                sender.send(message("x"), flags=5)
            elif mode == "no_response":
                sender.send()
        except pb_utils.TritonModelException as error:
            self.errors.append(error.message())
        if mode != "after_final":
            sender.send(flags=FINAL)
        return None
"""

# Not decoupled, answering through the response sender (Triton 2.51): from a thread after execute returned.
ONE_SHOT = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.errors = []

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if x[0] < 0:  # report the misuse seen so far, as a returned response
                text = " | ".join(self.errors).encode()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x),
                                                             pb_utils.Tensor("MSG", np.array([text], dtype=object))]))
                continue
            responses.append(None)
            threading.Thread(target=self.respond, args=(request.get_response_sender(), x), daemon=True).start()
        return responses

    def respond(self, sender, x):
        try:
            sender.send(flags=FINAL)
        except pb_utils.TritonModelException as error:
            self.errors.append(error.message())
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]), flags=FINAL)
        try:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        except pb_utils.TritonModelException as error:
            self.errors.append(error.message())
"""

# Streams until the client cancels; counts the cancellations it saw (IN < 0 reports the count).
CANCELLABLE = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = 0

    def execute(self, requests):
        request = requests[0]
        sender = request.get_response_sender()
        if pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0] < 0:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.seen], np.int32))]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        for i in range(1000):
            if request.is_cancelled():
                self.seen += sender.is_cancelled()
                break
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            time.sleep(0.02)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

DECOUPLED = "model_transaction_policy { decoupled: true }\n"
INT_IO = """
    input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
    output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""
MSG_IO = """
    input [ { name: "MODE", data_type: TYPE_STRING, dims: [ 1 ] } ]
    output [ { name: "MSG", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module", params=[0, 2], ids=["in-process-frontends", "frontend-processes"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           kit: Any) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("decoupled")
    kit.write_model(repo, "square", SQUARE, DECOUPLED + INT_IO)
    kit.write_model(repo, "misuse", MISUSE, DECOUPLED + MSG_IO)
    kit.write_model(repo, "one_shot", ONE_SHOT, INT_IO + """
        output [ { name: "MSG", data_type: TYPE_STRING, dims: [ 1 ] } ]
    """)
    kit.write_model(repo, "cancellable", CANCELLABLE, DECOUPLED + INT_IO)
    running = kit.start_server(repo, f"tsp_decoupled_{os.getpid()}_{uuid.uuid4().hex[:6]}_",
                               frontend_processes=request.param)
    yield running
    running.stop()


class Stream:
    """A tritonclient gRPC stream that asks for empty final responses, so each request's end is seen."""

    def __init__(self, server: RunningServer) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, model: str, request_id: str = "", **arrays: np.ndarray) -> None:
        inputs = []
        for name, array in arrays.items():
            datatype = "BYTES" if array.dtype.kind == "O" else grpcclient.np_to_triton_dtype(array.dtype)
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        self.client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)

    def next(self) -> tuple[Any, Any]:
        return self.results.get(timeout=60)

    def until_final(self) -> list[tuple[Any, Any]]:
        """Every (result, error) up to a final response or an error."""
        received = []
        while True:
            result, error = self.next()
            received.append((result, error))
            if error is not None or is_final(result):
                return received

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def is_final(result: Any) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def mode(name: str) -> dict[str, np.ndarray]:
    return {"MODE": np.array([name.encode()], dtype=object)}


@pytest.fixture
def stream(server: RunningServer) -> Iterator[Stream]:
    opened = Stream(server)
    yield opened
    opened.close()


def test_thread_sends_every_response_after_execute_returned(stream: Stream) -> None:
    stream.send("square", "a", IN=np.array([4], np.int32))
    received = stream.until_final()
    assert [error for _, error in received] == [None] * 5
    values = [int(result.as_numpy("OUT")[0]) for result, _ in received[:-1]]
    assert values == [0, 1, 2, 3]
    assert [is_final(result) for result, _ in received] == [False] * 4 + [True]
    assert received[-1][0].as_numpy("OUT") is None  # the empty final response
    assert {result.get_response().id for result, _ in received} == {"a"}


def test_concurrent_requests_interleave_on_one_instance(stream: Stream) -> None:
    for request_id, count in (("x", 30), ("y", 30), ("z", 0)):
        stream.send("square", request_id, IN=np.array([count], np.int32))
    counts: dict[str, int] = {"x": 0, "y": 0, "z": 0}
    finals = set()
    while len(finals) < 3:
        result, error = stream.next()
        assert error is None
        request_id = result.get_response().id
        if is_final(result):
            finals.add(request_id)
        else:
            counts[request_id] += 1
    assert counts == {"x": 30, "y": 30, "z": 0}


def test_aio_stream_infer_reads_every_response(server: RunningServer) -> None:
    async def stream() -> list[int]:
        client = grpcaio.InferenceServerClient(server.grpc_url)
        tensor = grpcaio.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([3], np.int32))

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": "square", "inputs": [tensor], "request_id": "aio"}

        values = []
        try:
            async for result, error in client.stream_infer(requests()):
                assert error is None
                values.append(int(result.as_numpy("OUT")[0]))
                if len(values) == 3:
                    break
        finally:
            await client.close()
        return values

    assert asyncio.run(stream()) == [0, 1, 2]


def test_unary_endpoints_refuse_a_decoupled_model(server: RunningServer) -> None:
    array = np.array([1], np.int32)
    with httpclient.InferenceServerClient(server.http_url) as http:
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(array)
        with pytest.raises(InferenceServerException,
                           match="HTTP end point doesn't support models with decoupled transaction policy"):
            http.infer("square", [tensor])
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(array)
    with pytest.raises(InferenceServerException,
                       match="ModelInfer RPC doesn't support models with decoupled transaction policy"):
        grpc.infer("square", [tensor])
    grpc.close()


def test_sender_misuse_raises_tritons_messages(stream: Stream) -> None:
    for name in ("after_final", "bad_flag", "no_response"):
        stream.send("misuse", name, **mode(name))
        assert all(error is None for _, error in stream.until_final())
    stream.send("misuse", "report", **mode("report"))
    (result, error), = stream.until_final()
    assert error is None
    assert result.as_numpy("MSG")[0].decode().split(" | ") == [
        "Unable to send response. Response sender has been closed.",
        "Unable to send response. Unsupported flag provided.",
        "Inference Response object must be provided when the response flags is set to zero.",
    ]


def test_decoupled_execute_returning_responses_fails_the_request(stream: Stream) -> None:
    stream.send("misuse", "r", **mode("return_list"))
    _, error = stream.next()
    assert error is not None and error.message() == (
        "Failed to process the request(s) for model 'misuse_0_0', message: Python model 'misuse_0_0' is using the "
        "decoupled mode and the execute function must return None.")


def test_execute_raising_after_a_response_ends_the_stream_with_its_error(stream: Stream) -> None:
    stream.send("misuse", "r", **mode("raise"))
    (first, first_error), (_, error) = stream.next(), stream.next()
    assert first_error is None and first.as_numpy("MSG")[0] == b"one"
    assert error is not None and "failed after one response" in str(error)
    stream.send("misuse", "after", **mode("no_response"))  # the stream and the model still serve
    assert all(error is None for _, error in stream.until_final())


def test_non_decoupled_model_answers_once_through_its_sender(server: RunningServer, kit: Any) -> None:
    with httpclient.InferenceServerClient(server.http_url) as http:
        result = kit.infer(http, "one_shot", IN=np.array([21], np.int32))
        assert result.as_numpy("OUT").tolist() == [42]
        expected = [
            "Unable to send response. Non-decoupled model cannot send complete final before sending a response.",
            "Unable to send response. Non-decoupled model cannot send more than one response.",
        ]

        def reported() -> list[str]:  # the thread's second send may still be on its way
            report = kit.infer(http, "one_shot", IN=np.array([-1], np.int32))
            return report.as_numpy("MSG")[0].decode().split(" | ")

        kit.wait_until(lambda: len(reported()) >= 2, "the model's second send")
        assert reported() == expected


def test_cancelling_the_stream_is_seen_by_is_cancelled(server: RunningServer, kit: Any) -> None:
    first = Stream(server)
    first.send("cancellable", "c", IN=np.array([0], np.int32))
    result, error = first.next()
    assert error is None and result.as_numpy("OUT").tolist() == [0]
    first.close(cancel=True)

    def seen() -> bool:
        probe = Stream(server)
        probe.send("cancellable", "probe", IN=np.array([-1], np.int32))
        (answer, _), = probe.until_final()
        probe.close()
        return int(answer.as_numpy("OUT")[0]) >= 1

    kit.wait_until(seen, "the model to see the cancellation")


def test_worker_death_ends_an_open_stream_with_an_error(server: RunningServer, kit: Any) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)

    def executions() -> int:  # counted once execute() has returned
        stats = grpc.get_inference_statistics("misuse", as_json=True)["model_stats"]
        return sum(int(version.get("execution_count", 0)) for version in stats)

    before = executions()
    stream = Stream(server)
    try:
        stream.send("misuse", "p", **mode("pid"))
        result, error = stream.next()
        assert error is None
        # the response can reach the client before execute() has returned: the death must come after it
        kit.wait_until(lambda: executions() > before, "execute() to return")
        os.kill(int(result.as_numpy("MSG")[0]), signal.SIGKILL)
        _, error = stream.next()
        assert error is not None
        assert ("python backend worker for instance 'misuse_0_0' of python model 'misuse' was killed by signal "
                "SIGKILL before the model sent the final response") in str(error)
    finally:
        stream.close()
    kit.wait_until(lambda: grpc.is_model_ready("misuse"), "the worker to restart")
    grpc.close()


def test_unloading_ends_an_open_stream_with_an_error(tmp_path: Path, kit: Any, python_server: Any) -> None:
    kit.write_model(tmp_path, "misuse", MISUSE, DECOUPLED + MSG_IO)
    server = python_server(tmp_path, model_control_mode="explicit", load_models=["misuse"])
    stream = Stream(server)
    try:
        stream.send("misuse", "p", **mode("pid"))
        result, error = stream.next()
        assert error is None
        with httpclient.InferenceServerClient(server.http_url) as http:
            http.unload_model("misuse")
            kit.wait_until(lambda: not http.is_model_ready("misuse"), "the unload")
        _, error = stream.next()
        assert error is not None
        assert ("python backend worker for instance 'misuse_0_0' of python model 'misuse' was stopped because the "
                "model unloads before the model sent the final response") in str(error)
    finally:
        stream.close()
