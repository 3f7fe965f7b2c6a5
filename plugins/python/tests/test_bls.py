"""Business logic scripting: Python models calling other models with pb_utils.InferenceRequest.exec/async_exec."""
from __future__ import annotations

import os
import queue
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer

ADD_SUB = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b),
                                                         pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
"""

SQUARE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for i in range(int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

CRASHER = """
import os


class TritonPythonModel:
    def execute(self, requests):
        os._exit(3)
"""

# The BLS model: MODE says which call to make; OUT carries numbers, MSG an error text or a count.
CALLER = """
import asyncio
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def add_sub_request(a, model_name="add_sub", names=("INPUT0", "INPUT1"), **kwargs):
    inputs = [pb_utils.Tensor(name, a) for name in names]
    return pb_utils.InferenceRequest(model_name=model_name, inputs=inputs,
                                     requested_output_names=["OUTPUT0", "OUTPUT1"], **kwargs)


def error_text(response):
    return response.error().message() if response.has_error() else "no error"


class TritonPythonModel:
    async def execute(self, requests):
        return [await self.answer(request) for request in requests]

    async def answer(self, request):
        a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
        out, msg = a, ""
        if mode == "sync":
            response = add_sub_request(a).exec()
            out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
        elif mode == "async":
            first, second = await asyncio.gather(add_sub_request(a).async_exec(),
                                                 add_sub_request(a * 10).async_exec())
            out = (pb_utils.get_output_tensor_by_name(first, "OUTPUT0").as_numpy()
                   + pb_utils.get_output_tensor_by_name(second, "OUTPUT0").as_numpy())
        elif mode in ("stream", "async_stream"):
            request = pb_utils.InferenceRequest(model_name="square", requested_output_names=["OUT"],
                                                inputs=[pb_utils.Tensor("IN", np.array([4], np.int32))])
            responses = (request.exec(decoupled=True) if mode == "stream"
                         else await request.async_exec(decoupled=True))
            values = []
            for response in responses:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if len(response.output_tensors()) > 0:
                    values.append(int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0]))
                else:
                    msg = "empty final response"
            out = np.array(values, np.int32)
        elif mode == "cancel_stream":  # the iterator's cancel() after the first response
            responses = pb_utils.InferenceRequest(model_name="ticker", requested_output_names=["OUT"],
                                                  inputs=[pb_utils.Tensor("IN", np.array([0], np.int32))]
                                                  ).exec(decoupled=True)
            values = []
            for response in responses:  # ends, with a CANCELLED error
                if response.has_error():
                    msg = f"CANCELLED: {response.error().code() == pb_utils.TritonError.CANCELLED}"
                else:
                    values.append(int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0]))
                    responses.cancel()
            responses.cancel()  # finished: nothing to cancel
            seen = pb_utils.InferenceRequest(model_name="ticker", requested_output_names=["OUT"],
                                             inputs=[pb_utils.Tensor("IN", np.array([-1], np.int32))]
                                             ).exec(decoupled=True)
            out = np.array(values[:1] + [int(pb_utils.get_output_tensor_by_name(next(seen), "OUT").as_numpy()[0])],
                           np.int32)
            for _ in seen:  # its final response
                pass
        elif mode == "ensemble":
            response = pb_utils.InferenceRequest(model_name="doubler", requested_output_names=["SUM"],
                                                 inputs=[pb_utils.Tensor("A", a)]).exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            out = pb_utils.get_output_tensor_by_name(response, "SUM").as_numpy()
        elif mode == "missing":
            msg = error_text(add_sub_request(a, model_name="no_such_model").exec())
        elif mode == "wrong_input":
            msg = error_text(add_sub_request(a, names=("INPUT0", "NOPE")).exec())
        elif mode == "decoupled_unary":
            request = pb_utils.InferenceRequest(model_name="square", requested_output_names=["OUT"],
                                                inputs=[pb_utils.Tensor("IN", np.array([2], np.int32))])
            msg = error_text(request.exec())
        elif mode == "self":
            msg = error_text(pb_utils.InferenceRequest(
                model_name="caller", requested_output_names=["OUT"], timeout=300000,
                inputs=[pb_utils.Tensor("A", a), pb_utils.Tensor("MODE", np.array([b"sync"], dtype=object))]).exec())
        elif mode == "crash_callee":
            msg = error_text(pb_utils.InferenceRequest(model_name="crasher", requested_output_names=["Y"],
                                                       inputs=[pb_utils.Tensor("X", a)]).exec())
        elif mode == "wait_child":
            msg = error_text(pb_utils.InferenceRequest(model_name="waiter", requested_output_names=["Y"],
                                                       inputs=[pb_utils.Tensor("X", a)]).exec())
        elif mode == "die_while_waiting":
            threading.Timer(0.2, os._exit, (4,)).start()
            pb_utils.InferenceRequest(model_name="sleeper", requested_output_names=["Y"],
                                      inputs=[pb_utils.Tensor("X", a)]).exec()
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out),
                                           pb_utils.Tensor("MSG", np.array([msg.encode()], dtype=object))])
"""

SLEEPER = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(1)
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
"""

# Waits until its request is cancelled (X[0] < 0: reports how many cancellations it saw instead).
WAITER = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = 0

    def execute(self, requests):
        request = requests[0]
        if pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0] >= 0:
            deadline = time.monotonic() + 20
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.seen += request.is_cancelled()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.full(4, self.seen, np.int32))])]
"""

# A decoupled model that relays a streaming BLS call's responses through its own response sender.
RELAY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            bls = pb_utils.InferenceRequest(model_name="square", requested_output_names=["OUT"],
                                            inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            for response in bls.exec(decoupled=True):
                if response.output_tensors():
                    sender.send(pb_utils.InferenceResponse(response.output_tensors()))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# A decoupled model that streams a count every 10 ms until its request is cancelled (IN[0] < 0: sends how
# many cancellations it saw instead).
TICKER = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = 0

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            if pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0] < 0:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.seen], np.int32))]))
            else:
                deadline = time.monotonic() + 20
                i = 0
                while not request.is_cancelled() and time.monotonic() < deadline:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
                    i += 1
                    time.sleep(0.01)
                self.seen += request.is_cancelled()
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# An ensemble over add_sub: SUM = A + A.
DOUBLER = """
name: "doubler"
platform: "ensemble"
input [ { name: "A", data_type: TYPE_INT32, dims: [ 4 ] } ]
output [ { name: "SUM", data_type: TYPE_INT32, dims: [ 4 ] } ]
ensemble_scheduling { step [ {
  model_name: "add_sub"
  model_version: -1
  input_map [ { key: "INPUT0" value: "A" }, { key: "INPUT1" value: "A" } ]
  output_map [ { key: "OUTPUT0" value: "SUM" } ]
} ] }
"""

INT_IO = """
    input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
    output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""
X_TO_Y = """
    input [ { name: "X", data_type: TYPE_INT32, dims: [ 4 ] } ]
    output [ { name: "Y", data_type: TYPE_INT32, dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, kit: Any) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("bls")
    kit.write_model(repo, "add_sub", ADD_SUB, """
        input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 4 ] },
                { name: "INPUT1", data_type: TYPE_INT32, dims: [ 4 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 4 ] },
                 { name: "OUTPUT1", data_type: TYPE_INT32, dims: [ 4 ] } ]
    """)
    kit.write_model(repo, "square", SQUARE, "model_transaction_policy { decoupled: true }\n" + INT_IO)
    kit.write_model(repo, "ticker", TICKER, "model_transaction_policy { decoupled: true }\n" + INT_IO)
    kit.write_model(repo, "relay", RELAY, "model_transaction_policy { decoupled: true }\n" + INT_IO)
    kit.write_model(repo, "crasher", CRASHER, X_TO_Y)
    kit.write_model(repo, "sleeper", SLEEPER, X_TO_Y)
    kit.write_model(repo, "waiter", WAITER, X_TO_Y)
    (repo / "doubler" / "1").mkdir(parents=True)
    (repo / "doubler" / "config.pbtxt").write_text(DOUBLER)
    kit.write_model(repo, "caller", CALLER, """
        input [ { name: "A", data_type: TYPE_INT32, dims: [ 4 ] },
                { name: "MODE", data_type: TYPE_STRING, dims: [ 1 ] } ]
        output [ { name: "OUT", data_type: TYPE_INT32, dims: [ -1 ] },
                 { name: "MSG", data_type: TYPE_STRING, dims: [ 1 ] } ]
    """)
    running = kit.start_server(repo, f"tsp_bls_{os.getpid()}_{uuid.uuid4().hex[:6]}_")
    yield running
    running.stop()


A = np.array([1, 2, 3, 4], np.int32)


def call(kit: Any, client: httpclient.InferenceServerClient, mode: str) -> tuple[list[int], str]:
    result = kit.infer(client, "caller", A=A, MODE=np.array([mode.encode()], dtype=object))
    return result.as_numpy("OUT").tolist(), result.as_numpy("MSG")[0].decode()


def test_exec_runs_another_model(kit: Any, client: httpclient.InferenceServerClient) -> None:
    assert call(kit, client, "sync") == ([2, 4, 6, 8], "")


def test_exec_runs_an_ensemble(kit: Any, client: httpclient.InferenceServerClient) -> None:
    assert call(kit, client, "ensemble") == ([2, 4, 6, 8], "")


def test_async_exec_runs_requests_concurrently(kit: Any, client: httpclient.InferenceServerClient) -> None:
    assert call(kit, client, "async") == ([22, 44, 66, 88], "")


@pytest.mark.parametrize("mode", ["stream", "async_stream"])
def test_streaming_bls_yields_every_response_of_a_decoupled_model(kit: Any, client: httpclient.InferenceServerClient,
                                                                  mode: str) -> None:
    assert call(kit, client, mode) == ([0, 1, 2, 3], "empty final response")


def test_cancel_on_a_streaming_bls_iterator_cancels_the_called_request(
        kit: Any, client: httpclient.InferenceServerClient) -> None:
    # the iterator ends with a CANCELLED error; the ticker saw is_cancelled() and stopped
    assert call(kit, client, "cancel_stream") == ([0, 1], "CANCELLED: True")


@pytest.mark.parametrize("mode, message", [
    ("missing", "Model no_such_model - Error when running inference: Failed for execute the inference request. "
                "Model 'no_such_model' is not ready."),
    ("decoupled_unary", "Model square is using the decoupled. The current BLS request call doesn't support models "
                        "using the decoupled transaction policy."),
    ("self", "Model caller - Error when running inference: no response within 0.3 s, so the request was "
             "cancelled"),
    ("crash_callee", "python backend worker for instance 'crasher_0_0' of python model 'crasher' exited with "
                     "code 3 while executing the request"),
])
def test_bls_failures_come_back_as_error_responses(kit: Any, client: httpclient.InferenceServerClient, mode: str,
                                                   message: str) -> None:
    _, msg = call(kit, client, mode)
    assert message in msg, msg
    assert call(kit, client, "sync") == ([2, 4, 6, 8], "")  # the caller still serves


def test_wrong_input_names_the_input(kit: Any, client: httpclient.InferenceServerClient) -> None:
    _, msg = call(kit, client, "wrong_input")
    assert msg == "Model add_sub - Error when running inference: unexpected inference input 'NOPE' for model 'add_sub'"


def test_a_worker_dying_in_a_bls_call_fails_its_request_and_restarts(kit: Any,
                                                                     client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(Exception, match="python backend worker for instance 'caller_0_0' of python model 'caller' "
                                        "exited with code 4 while executing the request"):
        call(kit, client, "die_while_waiting")
    kit.wait_until(lambda: client.is_model_ready("caller"), "the caller's worker to restart")
    assert call(kit, client, "sync") == ([2, 4, 6, 8], "")
    assert client.is_model_ready("sleeper")


def test_decoupled_model_relays_a_streaming_bls_call(server: RunningServer) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: results.put((result, error)))
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([3], np.int32))
    grpc.async_stream_infer("relay", [tensor], enable_empty_final_response=True)
    values = []
    while True:
        result, error = results.get(timeout=60)
        assert error is None
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
        values.append(int(result.as_numpy("OUT")[0]))
    grpc.stop_stream()
    grpc.close()
    assert values == [0, 1, 2]


def test_cancelling_the_caller_cancels_its_bls_request(server: RunningServer, kit: Any,
                                                       client: httpclient.InferenceServerClient) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput("A", [4], "INT32"), grpcclient.InferInput("MODE", [1], "BYTES")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(np.array([b"wait_child"], dtype=object))
    with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
        grpc.infer("caller", inputs, client_timeout=0.5)  # the deadline cancels the call on the server
    grpc.close()
    seen = kit.infer(client, "waiter", X=-A)  # queued behind the waiting execute, so it sees its end
    assert seen.as_numpy("Y").tolist() == [1, 1, 1, 1]
