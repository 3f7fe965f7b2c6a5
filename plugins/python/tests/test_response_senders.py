"""Response senders as Triton 2.51 runs them: answers before, during and after ``execute`` returns, several
requests per call, errors and cancellations; every stream ends, nothing waits forever."""
from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer

# Each request's PLAN says what its sender does, step by step: "e:" steps run inside execute, "t:" steps run
# once execute has returned (in a thread, or in an asyncio task for ``async def execute``). r: a response,
# rf: a response with the final flag, f: the final flag alone, s: a response whose error is a plain string
# (with the final flag), ret: execute returns a response for the request, w: wait 0.1 s, x: raise ValueError.
# Each response carries its index and how many requests the execute call got.
PLANNED = """
import asyncio
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.tasks = set()

    def execute(self, requests):
        returned = threading.Event()

        def start(steps, sender, state):
            threading.Thread(target=self.later, args=(returned, steps, sender, state), daemon=True).start()
        try:
            return self.plan(requests, start)
        finally:
            returned.set()

    async def execute_async(self, requests):
        def start(steps, sender, state):
            task = asyncio.create_task(self.later_async(steps, sender, state))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return self.plan(requests, start)

    def plan(self, requests, start_later):
        returned = []
        for request in requests:
            array = pb_utils.get_input_tensor_by_name(request, "PLAN").as_numpy()
            steps = array.reshape(-1)[0].decode().split()
            sender = request.get_response_sender()
            state = {"sent": 0, "count": len(requests), "shape": array.shape}
            self.run([step[2:] for step in steps if step.startswith("e:")], sender, state)
            returned.append(self.response(state) if "e:ret" in steps else None)
            later = [step[2:] for step in steps if step.startswith("t:")]
            if later:
                start_later(later, sender, state)
        return None if returned == [None] * len(requests) else returned

    def later(self, returned, steps, sender, state):
        returned.wait()
        time.sleep(0.05)  # execute has returned by now
        self.run(steps, sender, state)

    async def later_async(self, steps, sender, state):
        await asyncio.sleep(0.05)
        self.run(steps, sender, state)

    def response(self, state):
        state["sent"] += 1
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("OUT", np.full(state["shape"], state["sent"] - 1, np.int32)),
            pb_utils.Tensor("REQUESTS", np.full(state["shape"], state["count"], np.int32))])

    def run(self, steps, sender, state):
        for step in steps:
            if step == "ret":
                continue
            if step == "w":
                time.sleep(0.1)
                continue
            if step == "x":
                raise ValueError("planned failure")
            if step == "s":
                sender.send(pb_utils.InferenceResponse(error="the plan says fail"), flags=FINAL)
            else:
                sender.send(self.response(state) if step.startswith("r") else None, flags=FINAL if "f" in step else 0)
"""
ASYNC = "\nTritonPythonModel.execute = TritonPythonModel.execute_async\n"

RAISING = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            if pb_utils.get_input_tensor_by_name(request, "PLAN").as_numpy()[0] == b"send":
                request.get_response_sender().send(
                    pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], np.int32))]))
        self.fail(len(requests))

    def fail(self, count):
        raise ValueError(f"no luck with {count} request(s)")
"""


# A model that never answers its request (no response, no final flag).
SILENT = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return None
"""

# Forwards, through its own sender, the responses of a BLS request to the decoupled "planned" model.
BLS_STREAMER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            plan = pb_utils.get_input_tensor_by_name(request, "PLAN")
            bls = pb_utils.InferenceRequest(model_name="planned", inputs=[plan], requested_output_names=["OUT"])
            for response in bls.exec(decoupled=True):
                if response.has_error():
                    sender.send(pb_utils.InferenceResponse(error=response.error()), flags=1)
                    break
                outputs = response.output_tensors()
                if outputs:
                    sender.send(pb_utils.InferenceResponse(outputs))
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

IO = """
    input [ { name: "PLAN", data_type: TYPE_STRING, dims: [ 1 ] } ]
    output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] },
             { name: "REQUESTS", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""
DECOUPLED = "model_transaction_policy { decoupled: true }\n"
# Seven requests make one batch (Triton's response_sender test sends seven at once).
BATCHING = "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 7 ] max_queue_delay_microseconds: 3000000 }\n"
MODELS = {  # name: (model.py, config)
    "planned": (PLANNED, DECOUPLED + IO),
    "planned_async": (PLANNED + ASYNC, DECOUPLED + IO),
    "planned_batch": (PLANNED, DECOUPLED + BATCHING + IO),
    "planned_async_batch": (PLANNED + ASYNC, DECOUPLED + BATCHING + IO),
    "planned_unary": (PLANNED, IO),
    "planned_unary_async": (PLANNED + ASYNC, IO),
    "planned_unary_batch": (PLANNED, BATCHING.replace("7", "3") + IO),
    "raising": (RAISING, DECOUPLED + IO),
    "raising_unary": (RAISING, IO),
    "silent": (SILENT, IO),
    "bls_streamer": (BLS_STREAMER, DECOUPLED + IO),
}


@pytest.fixture(scope="module", params=[0, 2], ids=["in-process-frontends", "frontend-processes"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           kit: Any) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("senders")
    for name, (model_py, config) in MODELS.items():
        kit.write_model(repo, name, model_py, config)
    running = kit.start_server(repo, f"tsp_senders_{os.getpid()}_{uuid.uuid4().hex[:6]}_",
                               frontend_processes=request.param)
    yield running
    running.stop()


class Stream:
    """A gRPC stream that asks for empty final responses; every wait is bounded."""

    def __init__(self, server: RunningServer) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, model: str, plan: str, request_id: str = "", batched: bool = False) -> None:
        shape = [1, 1] if batched else [1]
        tensor = grpcclient.InferInput("PLAN", shape, "BYTES")
        tensor.set_data_from_numpy(np.array([plan.encode()], dtype=object).reshape(shape))
        self.client.async_stream_infer(model, [tensor], request_id=request_id, enable_empty_final_response=True)

    def next(self) -> tuple[Any, Any]:
        try:
            return self.results.get(timeout=30)
        except queue.Empty:
            pytest.fail("the stream sent nothing for 30 s")

    def collect(self, request_ids: set[str]) -> dict[str, list[tuple[Any, Any]]]:
        """Every (result, error) of each request, up to its final response or its error; then nothing more."""
        received: dict[str, list[tuple[Any, Any]]] = {request_id: [] for request_id in request_ids}
        ended: set[str] = set()
        while ended != request_ids:
            result, error = self.next()
            # an error names no request: the tests that expect one send one request at a time, with id ""
            request_id = "" if result is None else result.get_response().id
            assert request_id not in ended, f"request {request_id} answered after its end"
            received[request_id].append((result, error))
            if error is not None or is_final(result):
                ended.add(request_id)
        self.assert_idle()
        return received

    def until_final(self) -> list[tuple[Any, Any]]:
        """Every (result, error) of the one request sent, up to its end; then nothing more."""
        return self.collect({""})[""]

    def assert_idle(self) -> None:
        """Nothing more arrives: the stream really ended every request."""
        with pytest.raises(queue.Empty):
            self.results.get(timeout=0.2)

    def close(self) -> None:
        """End the stream at once, cancelling what it still runs (a plain stop would wait for every request)."""
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


def is_final(result: Any) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def values(received: list[tuple[Any, Any]]) -> list[int]:
    """The OUT values of the responses that carry one."""
    return [int(result.as_numpy("OUT").reshape(-1)[0]) for result, error in received
            if error is None and result.as_numpy("OUT") is not None]


@pytest.fixture
def stream(server: RunningServer) -> Iterator[Stream]:
    opened = Stream(server)
    yield opened
    opened.close()


# Triton's response_sender test cases: plan -> the OUT values the client gets (finals end every request).
DECOUPLED_PLANS = {
    "zero_pre": ("e:f", []),
    "zero_post": ("t:f", []),
    "one_pre": ("e:rf", [0]),
    "one_post": ("t:rf", [0]),
    "two_pre": ("e:r e:rf", [0, 1]),
    "two_post": ("t:r t:rf", [0, 1]),
    "pre_and_post": ("e:r t:r t:r t:rf", [0, 1, 2, 3]),
}


# ---- item 1: senders stay open until the final flag, whatever execute returned -----------------------

@pytest.mark.parametrize("model", ["planned", "planned_async"])
def test_decoupled_senders_answer_before_and_after_execute_returns(stream: Stream, model: str) -> None:
    for request_id, (plan, _) in DECOUPLED_PLANS.items():
        stream.send(model, plan, request_id)
    received = stream.collect(set(DECOUPLED_PLANS))
    for request_id, (_, expected) in DECOUPLED_PLANS.items():
        answers = received[request_id]
        assert [error for _, error in answers] == [None] * len(answers), request_id
        assert values(answers) == expected, request_id
        assert is_final(answers[-1][0]), request_id


@pytest.mark.parametrize("model", ["planned_batch", "planned_async_batch"])
def test_decoupled_batch_answers_each_request_zero_one_or_more_times(stream: Stream, model: str) -> None:
    for request_id, (plan, _) in DECOUPLED_PLANS.items():
        stream.send(model, plan, request_id, batched=True)
    received = stream.collect(set(DECOUPLED_PLANS))
    for request_id, (_, expected) in DECOUPLED_PLANS.items():
        assert values(received[request_id]) == expected, request_id
    requests = {int(result.as_numpy("REQUESTS")[0][0]) for answers in received.values() for result, _ in answers
                if result.as_numpy("REQUESTS") is not None}
    assert requests == {7}  # the seven requests came in one execute call


# plan -> what a non-decoupled model's one response holds
UNARY_PLANS = ["e:ret", "e:rf", "t:rf", "e:r t:f", "t:r t:f"]


@pytest.mark.parametrize("model", ["planned_unary", "planned_unary_async"])
def test_non_decoupled_sender_answers_once_before_on_or_after_return(server: RunningServer, kit: Any,
                                                                      model: str) -> None:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=30) as http:
        for plan in UNARY_PLANS:
            result = kit.infer(http, model, PLAN=np.array([plan.encode()], dtype=object))
            assert result.as_numpy("OUT").tolist() == [0], plan
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for plan in UNARY_PLANS:
            tensor = grpcclient.InferInput("PLAN", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([plan.encode()], dtype=object))
            assert grpc.infer(model, [tensor], client_timeout=30).as_numpy("OUT").tolist() == [0], plan
    finally:
        grpc.close()


def test_non_decoupled_batch_mixes_returned_and_sent_answers(server: RunningServer) -> None:
    def infer(plan: str) -> list[int]:
        with httpclient.InferenceServerClient(server.http_url, network_timeout=30) as http:
            tensor = httpclient.InferInput("PLAN", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[plan.encode()]], dtype=object))
            result = http.infer("planned_unary_batch", [tensor])
            return [int(result.as_numpy("OUT")[0][0]), int(result.as_numpy("REQUESTS")[0][0])]

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(infer, ["e:ret", "e:rf", "t:rf"]))
    assert answers == [[0, 3]] * 3  # one execute call, each request answered its own way


def test_non_decoupled_misuse_on_a_stream_gives_one_answer(stream: Stream) -> None:
    """Triton's cases: a second response, or a response returned after the sender closed, is refused in the
    model; the client sees only the first response (a non-decoupled stream gets one response per request)."""
    for plan in ("e:rf e:ret", "e:ret t:r"):
        stream.send("planned_unary", plan)
        answers = stream.until_final()
        assert [error for _, error in answers] == [None] and values(answers) == [0], plan
    stream.send("planned_unary", "e:r e:r")  # the first response, not final; the batch's error goes nowhere
    result, error = stream.next()
    assert error is None and values([(result, None)]) == [0] and not is_final(result)
    stream.assert_idle()


def test_non_decoupled_final_flag_without_a_response_is_an_error(server: RunningServer, kit: Any) -> None:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=30) as http:
        for model in ("planned_unary", "planned_unary_async"):
            with pytest.raises(InferenceServerException) as raised:
                kit.infer(http, model, PLAN=np.array([b"e:f"], dtype=object))
            assert raised.value.status() == "500"
            assert raised.value.message().startswith(
                f"Failed to process the request(s) for model '{model}_0_0', message: TritonModelException: Unable "
                "to send response. Non-decoupled model cannot send complete final before sending a response.")


# ---- item 2: an error given as a plain string ------------------------------------------------------

def test_response_error_may_be_a_plain_string(server: RunningServer, kit: Any, stream: Stream) -> None:
    stream.send("planned", "e:r e:s")
    (first, first_error), (_, error) = stream.until_final()
    assert first_error is None and values([(first, None)]) == [0]
    assert error is not None and error.message() == "the plan says fail"
    with httpclient.InferenceServerClient(server.http_url, network_timeout=30) as http:
        with pytest.raises(InferenceServerException) as raised:
            kit.infer(http, "planned_unary", PLAN=np.array([b"t:s"], dtype=object))
    assert raised.value.status() == "500" and raised.value.message() == "the plan says fail"


# ---- items 3 and 4: errors end the stream with Triton's texts; nothing waits forever --------------------

def _raised_message(server: RunningServer, model: str) -> re.Pattern[str]:
    """Triton's text for RAISING's ValueError: the instance, the exception, and the model's frames, innermost
    first (pybind11's format)."""
    model_file = re.escape(str(Path(server.options.model_repositories[0]) / model / "1" / "model.py"))
    return re.compile(f"Failed to process the request\\(s\\) for model '{model}_0_0', message: ValueError: no luck "
                      f"with 1 request\\(s\\)\n\nAt:\n  {model_file}\\(15\\): fail\n  {model_file}\\(12\\): execute\n\\Z")


def test_decoupled_execute_raising_ends_the_stream_with_tritons_message(stream: Stream, server: RunningServer) -> None:
    stream.send("raising", "send")
    received = stream.until_final()
    assert values(received[:-1]) == [7]
    error = received[-1][1]
    assert error is not None and _raised_message(server, "raising").match(error.message()), error.message()


def test_non_decoupled_execute_raising_gives_tritons_message(server: RunningServer, kit: Any) -> None:
    expected = _raised_message(server, "raising_unary")
    with httpclient.InferenceServerClient(server.http_url, network_timeout=30) as http:
        with pytest.raises(InferenceServerException) as raised:
            kit.infer(http, "raising_unary", PLAN=np.array([b"no"], dtype=object))
    assert raised.value.status() == "500" and expected.match(raised.value.message()), raised.value.message()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("PLAN", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b"no"], dtype=object))
        with pytest.raises(InferenceServerException) as raised:
            grpc.infer("raising_unary", [tensor], client_timeout=30)
    finally:
        grpc.close()
    assert raised.value.status() == "StatusCode.INTERNAL" and expected.match(raised.value.message())


# python_backend's pb_stub.cc: the stub is named after the instance, and both names in the text are its name.
RETURNED_IN_DECOUPLED = ("Failed to process the request(s) for model 'planned_0_0', message: Python model "
                         "'planned_0_0' is using the decoupled mode and the execute function must return None.")


def test_decoupled_errors_end_the_stream(stream: Stream, server: RunningServer) -> None:
    cases = {
        "e:ret": RETURNED_IN_DECOUPLED,
        "e:ret t:r": RETURNED_IN_DECOUPLED,  # the thread's send fails
        "e:s": "the plan says fail",
    }
    for plan, text in cases.items():
        stream.send("planned", plan)
        ((result, error),) = stream.until_final()
        assert result is None and error is not None and error.message() == text, plan
    reply = httpx.post(f"http://{server.http_url}/v2/models/planned/generate_stream", json={"PLAN": "e:ret"},
                       timeout=30)  # over HTTP: Triton's status for it, INTERNAL, and its one event
    assert reply.status_code == 500 and reply.text.startswith("data: ") and reply.text.endswith("\n\n")
    assert json.loads(reply.text[len("data: "):]) == {"error": RETURNED_IN_DECOUPLED}
    stream.send("planned", "e:rf e:ret")  # Triton: the sender was closed, so the client sees only the response
    answers = stream.until_final()
    assert [error for _, error in answers] == [None] and values(answers) == [0]
    stream.send("planned", "e:rf t:r")  # a send after the final flag fails in the model; the stream goes on
    assert values(stream.until_final()) == [0]


def test_decoupled_async_execute_raising_in_the_background_ends_its_requests(stream: Stream) -> None:
    """Triton runs a decoupled ``async def execute`` in the background and only logs its exception (the request
    then waits for its client to go away); here its requests also end, with Triton's text for the failure."""
    stream.send("planned_async", "e:r e:x")
    answers = stream.until_final()
    assert values(answers) == [0]
    message = answers[-1][1].message()
    assert message.startswith("Failed to process the request(s) for model 'planned_async_0_0', message: ValueError: "
                              "planned failure\n\nAt:\n  ") and message.endswith("): execute_async\n"), message
    stream.send("planned", "e:r e:x")  # the same, raised by a plain execute
    answers = stream.until_final()
    assert values(answers) == [0] and "message: ValueError: planned failure" in answers[-1][1].message()


def test_bls_streamed_inside_execute_reaches_the_client(stream: Stream) -> None:
    stream.send("bls_streamer", "e:r t:r t:rf")
    answers = stream.until_final()
    assert [error for _, error in answers] == [None] * 4 and values(answers) == [0, 1, 2]
    stream.send("bls_streamer", "e:r e:s")  # the BLS stream's error ends the outer request with it
    answers = stream.until_final()
    assert values(answers) == [0] and answers[-1][1] is not None and "the plan says fail" in answers[-1][1].message()


def _open_requests(server: RunningServer, model: str) -> int:
    """How many requests the model's worker still holds (white box: nothing a client can see)."""
    instance = server.server.repository.get_version(model).instances[0]
    return len(instance._worker.open_requests)  # type: ignore[attr-defined]


def test_cancelled_while_in_execute_releases_the_request(server: RunningServer, kit: Any, stream: Stream) -> None:
    cancelled = Stream(server)
    cancelled.send("planned", "e:r " + "e:w " * 5)  # half a second in execute, and never a final flag
    _, error = cancelled.next()
    assert error is None
    cancelled.close()
    kit.wait_until(lambda: _open_requests(server, "planned") == 0, "the cancelled request to be released")
    stream.send("planned", "e:rf")  # the model serves on
    assert values(stream.until_final()) == [0]


def test_a_request_its_model_never_answers_ends_with_its_client(server: RunningServer, kit: Any) -> None:
    """Triton keeps it until the model answers or the client goes away; the client's deadline ends it here."""
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("PLAN", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b""], dtype=object))
        with pytest.raises(InferenceServerException) as raised:
            grpc.infer("silent", [tensor], client_timeout=0.5)
        assert raised.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    finally:
        grpc.close()
    kit.wait_until(lambda: _open_requests(server, "silent") == 0, "the abandoned request to be released")
