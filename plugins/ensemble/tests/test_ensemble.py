"""Ensembles of the core's toy models through the real clients: data flow, concurrency, nesting, streaming,
failures, backpressure, statistics and model control."""
from __future__ import annotations

import queue
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.testing import probe_config

ADD_SUB = """
backend: "toy_add_sub"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    """One ``ensemble_scheduling`` step in config text."""
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version}{maps} }}'


def tensor(name: str, dims: str = "[ 2 ]", datatype: str = "TYPE_FP32", extra: str = "") -> str:
    return f'{{ name: "{name}" data_type: {datatype} dims: {dims} {extra}}}'


def ensemble(inputs: list[str], outputs: list[str], steps: list[str], extra: str = "",
             max_batch_size: int = 0) -> str:
    """An ensemble config: ``inputs``/``outputs`` from ``tensor``, ``steps`` from ``step``."""
    return (f'platform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
            f'input [ {", ".join(inputs)} ]\noutput [ {", ".join(outputs)} ]\n'
            f'ensemble_scheduling {{ step [ {", ".join(steps)} ] {extra}}}\n')


# sum = A + B, diff = A - B; OUT = sum + diff (= 2A)
TWO_STEPS = ensemble(
    [tensor("A"), tensor("B")], [tensor("OUT"), tensor("SUM")],
    [step("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM", "OUTPUT1": "diff"}),
     step("add_sub", {"INPUT0": "SUM", "INPUT1": "diff"}, {"OUTPUT0": "OUT"})])


IDENTITY_INT = """
backend: "toy_identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
REPEAT = """
backend: "toy_repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
PROBE = probe_config(8) + 'instance_group [ { count: 2 kind: KIND_CPU } ]\n'


def fp32(name: str, values: list[float], client: Any = httpclient) -> Any:
    tensor = client.InferInput(name, [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, np.float32))
    return tensor


@pytest.mark.parametrize("frontend_processes", [0, 2])
def test_steps_chain_through_http_and_grpc(add_model, serve, frontend_processes: int) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("pipeline", TWO_STEPS)
    server = serve(frontend_processes=frontend_processes)
    http = httpclient.InferenceServerClient(server.http_url)
    result = http.infer("pipeline", [fp32("A", [1, 2]), fp32("B", [5, 7])])
    assert result.as_numpy("OUT").tolist() == [2, 4] and result.as_numpy("SUM").tolist() == [6, 9]
    only_out = http.infer("pipeline", [fp32("A", [1, 2]), fp32("B", [5, 7])],
                          outputs=[httpclient.InferRequestedOutput("OUT")])
    assert only_out.as_numpy("SUM") is None and only_out.as_numpy("OUT").tolist() == [2, 4]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    answer = grpc.infer("pipeline", [fp32("A", [3, 4], grpcclient), fp32("B", [0, 1], grpcclient)])
    assert answer.as_numpy("OUT").tolist() == [6, 8]
    assert grpc.get_model_metadata("pipeline").platform == "ensemble"
    stats = {s["name"]: s for s in http.get_inference_statistics()["model_stats"]}
    assert stats["pipeline"]["inference_stats"]["success"]["count"] == 3
    assert stats["pipeline"]["execution_count"] == 3 and stats["pipeline"]["inference_count"] == 3
    assert stats["add_sub"]["inference_stats"]["success"]["count"] == 6  # two steps per ensemble request


def test_independent_steps_run_at_the_same_time(add_model, serve) -> None:  # type: ignore[no-untyped-def]
    add_model("probe", PROBE)
    add_model("branches", ensemble(
        [tensor("DELAY", "[ -1 ]")], [tensor("PEAK_A", "[ 1 ]", "TYPE_INT64"), tensor("PEAK_B", "[ 1 ]", "TYPE_INT64")],
        [step("probe", {"INPUT0": "DELAY"}, {"PEAK": "PEAK_A"}),
         step("probe", {"INPUT0": "DELAY"}, {"PEAK": "PEAK_B"})],
        max_batch_size=8))
    client = httpclient.InferenceServerClient(serve().http_url)
    delay = httpclient.InferInput("DELAY", [1, 1], "FP32")
    delay.set_data_from_numpy(np.array([[0.3]], np.float32))
    result = client.infer("branches", [delay])
    # the probe reports how many of its executions ran at once: both branches overlapped
    assert max(result.as_numpy("PEAK_A").item(), result.as_numpy("PEAK_B").item()) == 2


def test_max_inflight_requests_holds_a_step_back(add_model, serve) -> None:  # type: ignore[no-untyped-def]
    add_model("probe", PROBE)
    add_model("limited", ensemble([tensor("DELAY", "[ -1 ]")], [tensor("PEAK", "[ 1 ]", "TYPE_INT64")],
                                  [step("probe", {"INPUT0": "DELAY"}, {"PEAK": "PEAK"})],
                                  extra="max_inflight_requests: 1 ", max_batch_size=8))
    client = httpclient.InferenceServerClient(serve().http_url, concurrency=4)
    delay = httpclient.InferInput("DELAY", [1, 1], "FP32")
    delay.set_data_from_numpy(np.array([[0.2]], np.float32))
    pending = [client.async_infer("limited", [delay]) for _ in range(3)]
    peaks = [p.get_result().as_numpy("PEAK").item() for p in pending]
    assert peaks == [1, 1, 1]  # two idle instances, yet the step had one request in flight at a time


def test_an_ensemble_inside_an_ensemble(add_model, serve) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("pipeline", TWO_STEPS)
    add_model("outer", ensemble([tensor("X"), tensor("Y")], [tensor("RESULT")], [
        step("pipeline", {"A": "X", "B": "Y"}, {"OUT": "doubled"}),
        step("pipeline", {"A": "doubled", "B": "Y"}, {"OUT": "RESULT"})]))
    client = httpclient.InferenceServerClient(serve().http_url)
    assert client.infer("outer", [fp32("X", [1, -2]), fp32("Y", [9, 9])]).as_numpy("RESULT").tolist() == [4, -8]
    stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    assert stats["pipeline"]["inference_stats"]["success"]["count"] == 2
    assert stats["add_sub"]["inference_stats"]["success"]["count"] == 4


def test_optional_inputs_may_be_left_out(add_model, serve) -> None:  # type: ignore[no-untyped-def]
    add_model("pass", 'backend: "toy_identity"\nmax_batch_size: 0\n'
              'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }, '
              '{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 2 ] optional: true } ]\n'
              'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }, '
              '{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')
    add_model("optional", ensemble([tensor("A"), tensor("B", extra="optional: true ")], [tensor("OA")],
                                   [step("pass", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "OA"})]))
    client = httpclient.InferenceServerClient(serve().http_url)
    assert client.infer("optional", [fp32("A", [1, 2]), fp32("B", [3, 4])]).as_numpy("OA").tolist() == [1, 2]
    # without B the step runs at once, without INPUT1 (it does not wait for a tensor that will never come)
    assert client.infer("optional", [fp32("A", [5, 6])]).as_numpy("OA").tolist() == [5, 6]


@pytest.mark.parametrize("frontend_processes", [0, 2])
def test_a_decoupled_last_step_streams_each_response(add_model, serve, frontend_processes: int) -> None:  # type: ignore[no-untyped-def]
    add_model("identity", IDENTITY_INT)
    add_model("repeat", REPEAT)
    add_model("tokens", ensemble([tensor("N", "[ 1 ]", "TYPE_INT32")], [tensor("TOKEN", "[ 1 ]", "TYPE_INT32")], [
        step("identity", {"INPUT0": "N"}, {"OUTPUT0": "count"}),
        step("repeat", {"INPUT0": "count"}, {"OUTPUT0": "raw"}),
        step("identity", {"INPUT0": "raw"}, {"OUTPUT0": "TOKEN"})]))
    server = serve(frontend_processes=frontend_processes)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert grpc.get_model_config("tokens").config.model_transaction_policy.decoupled  # as Triton marks it
    received: queue.Queue[Any] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: received.put(error or result))
    count = grpcclient.InferInput("N", [1], "INT32")
    count.set_data_from_numpy(np.array([3], np.int32))
    grpc.async_stream_infer("tokens", [count], enable_empty_final_response=True)
    tokens = []
    while True:
        result = received.get(timeout=30)
        assert not isinstance(result, InferenceServerException), result
        response = result.get_response()
        if response.parameters["triton_final_response"].bool_param:
            break
        tokens.append(result.as_numpy("TOKEN").item())
    grpc.stop_stream()
    assert tokens == [0, 1, 2]
    with pytest.raises(InferenceServerException, match="doesn't support models with decoupled transaction policy"):
        httpclient.InferenceServerClient(server.http_url).infer("tokens", [fp32("N", [3])])


def test_a_failing_step_fails_the_request_with_its_error(add_model, serve) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("bad", 'backend: "toy_error"\nmax_batch_size: 0\ninput [ { name: "INPUT0" data_type: TYPE_FP32 '
              'dims: [ 2 ] } ]\noutput [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')
    add_model("failing", ensemble([tensor("A"), tensor("B")], [tensor("OUT")], [
        step("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "sum"}),
        step("bad", {"INPUT0": "sum"}, {"OUTPUT0": "OUT"})]))
    client = httpclient.InferenceServerClient(serve().http_url)
    with pytest.raises(InferenceServerException, match="toy_error model 'bad' always fails"):
        client.infer("failing", [fp32("A", [1, 2]), fp32("B", [3, 4])])
    with pytest.raises(InferenceServerException, match="unexpected shape for input 'A' for model 'failing'"):
        client.infer("failing", [fp32("A", [1, 2, 3]), fp32("B", [3, 4])])
    stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    # Triton counts the failed step twice for the ensemble; the invalid input counts once (Triton: not at all).
    assert stats["failing"]["inference_stats"]["fail"]["count"] == 3
    assert client.is_model_ready("add_sub") and client.is_model_ready("failing")
