"""The sequence batcher through tritonclient HTTP and gRPC (unary and stream), proven by what a
toy sequence model sees and returns and by the statistics extension."""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.utils import InferenceServerException

from triton_serve.plugin import (Backend, BackendRegistry, InferenceClient, InferenceRequest, InferenceResponse,
                                 InstancePool, InstanceSpec, Model, ModelConfig, ModelContext, ModelInstance,
                                 ModelInstanceGroup, ModelSpec, ServerError, Status, Tensor, hookimpl)
from triton_serve.testing import RunningServer
from triton_serve_batching.sequence import SequenceBatcher

# ---- a toy sequence model ----------------------------------------------------------------------

# The batches each toy model executed: (sequence_id, START, END) per request.
EXECUTIONS: dict[str, list[list[tuple[int | str, bool, bool]]]] = {}


class SequenceToyInstance(ModelInstance):
    """OUTPUT = INPUT + the sequence's running total. The total comes from the implicit state
    input STATE_IN when the config has one (and goes out as STATE_OUT), else from this instance's
    memory keyed by the CORRID control (reset when the START control is non-zero). A declared
    output ``<X>_ECHO`` echoes control input X; INSTANCE is this instance's index. The config
    parameter ``delay_s`` makes every execution that slow."""

    def __init__(self, model: Model, spec: InstanceSpec) -> None:
        super().__init__(model, spec)
        self.totals: dict[Any, np.ndarray] = {}

    async def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse]:
        EXECUTIONS.setdefault(self.model.spec.name, []).append(
            [(r.sequence_id, r.sequence_start, r.sequence_end) for r in requests])
        parameters = self.model.spec.config.parameters
        if "delay_s" in parameters:
            await asyncio.sleep(float(parameters["delay_s"].string_value))
        return [self._answer(request) for request in requests]

    def _answer(self, request: InferenceRequest) -> InferenceResponse:
        inputs = request.inputs
        value = inputs["INPUT"].data
        if "STATE_IN" in inputs:
            total = value + inputs["STATE_IN"].data
        elif "CORRID" in inputs:
            key = inputs["CORRID"].data.item()
            if inputs["START"].data.item():
                self.totals.pop(key, None)
            total = self.totals[key] = value + self.totals.get(key, 0)
        else:
            total = value
        outputs = [Tensor("OUTPUT", "INT32", value.shape, total)]
        if "STATE_IN" in inputs:
            outputs.append(Tensor("STATE_OUT", "INT32", total.shape, total))
        for spec in self.model.spec.config.output:
            if spec.name.endswith("_ECHO"):
                echoed = inputs[spec.name.removesuffix("_ECHO")]
                outputs.append(Tensor(spec.name, echoed.datatype, echoed.shape, echoed.data))
            elif spec.name == "INSTANCE":
                index = np.full(value.shape, self.spec.index, np.int32)
                outputs.append(Tensor("INSTANCE", "INT32", value.shape, index))
        return InferenceResponse(outputs)


class SequenceToyModel(Model):
    """One version of a ``toy_sequence`` model."""

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return SequenceToyInstance(self, instance)


class SequenceToyBackend(Backend):
    """Backend ``toy_sequence``: see SequenceToyInstance."""

    name = "toy_sequence"

    def create_model(self, spec: ModelSpec) -> Model:
        return SequenceToyModel(self, spec)


class SequenceTestPlugin:
    """Registers the toy backend (the installed batching plugin provides the sequence batcher)."""

    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(SequenceToyBackend)


def model_config(name: str, sequence_batching: str, *, max_batch_size: int = 4, outputs: str = "",
                 instances: int = 1, delay_s: float = 0.0) -> str:
    dims = "[ 1 ]"
    parameters = f'parameters {{ key: "delay_s" value {{ string_value: "{delay_s}" }} }}' if delay_s else ""
    return f"""
name: "{name}"
backend: "toy_sequence"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: {dims} }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: {dims} }} {outputs} ]
instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
sequence_batching {{ {sequence_batching} }}
{parameters}
"""


ACCUMULATOR_CONTROLS = """
control_input [
  { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
"""
INSTANCE_OUTPUT = ', { name: "INSTANCE" data_type: TYPE_INT32 dims: [ 1 ] }'


def state(initial: str = "") -> str:
    return f'state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] {initial} }} ]'


def write_model(repo: Path, text: str, files: dict[str, bytes] | None = None) -> ModelSpec:
    config = text_format.Parse(text, ModelConfig())
    model_dir = repo / config.name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(text)
    for relative, content in (files or {}).items():
        (model_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / relative).write_bytes(content)
    return ModelSpec(config.name, 1, config, model_dir, model_dir / "1")


@pytest.fixture
def serve(tserve: Callable[..., RunningServer], tmp_path: Path) -> Callable[..., RunningServer]:
    """``serve(*config_texts, files={model: {relative path: bytes}}, **server options)``: serve these toy
    models."""
    def start(*configs: str, files: dict[str, dict[str, bytes]] | None = None, **options: Any) -> RunningServer:
        repo = tmp_path / "models"
        repo.mkdir()
        for text in configs:
            name = text_format.Parse(text, ModelConfig()).name
            write_model(repo, text, (files or {}).get(name))
        return tserve(repo, extra_plugins=[("sequence_toy", SequenceTestPlugin())], **options)
    return start


# ---- client helpers ----------------------------------------------------------------------------

def infer(server: RunningServer, model: str, value: int, sequence_id: int | str = 0, *, start: bool = False,
          end: bool = False, module: Any = httpclient, outputs: Sequence[str] = (), rows: int = 1,
          batched: bool = True) -> Any:
    """One request through its own client; returns the InferResult."""
    client = module.InferenceServerClient(server.http_url if module is httpclient else server.grpc_url)
    shape = [rows, 1] if batched else [1]
    tensor = module.InferInput("INPUT", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, value, np.int32))
    requested = [module.InferRequestedOutput(name) for name in outputs] or None
    return client.infer(model, [tensor], outputs=requested, sequence_id=sequence_id, sequence_start=start,
                        sequence_end=end)


def value(result: Any, name: str = "OUTPUT") -> Any:
    return result.as_numpy(name).reshape(-1)[0]


def concurrently(calls: list[Callable[[], Any]]) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


def stats(server: RunningServer, model: str) -> dict[str, Any]:
    return httpclient.InferenceServerClient(server.http_url).get_inference_statistics(model)["model_stats"][0]


def batch_sizes(model_stats: dict[str, Any]) -> dict[int, int]:
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in model_stats["batch_stats"]}


def rejected(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


# ---- control inputs ----------------------------------------------------------------------------

def echo_model(name: str, controls: dict[str, str], corrid_type: str, max_batch_size: int = 4) -> str:
    """A model whose START/END/READY controls are configured as ``controls`` says and whose outputs
    echo every control input."""
    inputs = [f'{{ name: "{kind}" control [ {{ kind: CONTROL_SEQUENCE_{kind} {text} }} ] }}'
              for kind, text in controls.items()]
    inputs.append(f'{{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}')
    types = {"int32": "TYPE_INT32", "fp32": "TYPE_FP32", "bool": "TYPE_BOOL"}
    echoes = {kind: types[text.split("_")[0]] for kind, text in controls.items()} | {"CORRID": corrid_type}
    outputs = "".join(f', {{ name: "{kind}_ECHO" data_type: {t} dims: [ 1 ] }}' for kind, t in echoes.items())
    return model_config(name, f"control_input [ {', '.join(inputs)} ]", outputs=outputs,
                        max_batch_size=max_batch_size)


# name, controls, CORRID type, sequence id, CORRID value the model sees, max_batch_size,
# and per control its expected (false, true) values: the configured ones, some inverted.
ECHO_CASES = [
    ("echo_u64", {"START": "int32_false_true: [ 7, 9 ]", "END": "fp32_false_true: [ 0.5, 2.5 ]",
                  "READY": "bool_false_true: [ true, false ]"}, "TYPE_UINT64", 2 ** 40 + 5, 2 ** 40 + 5, 4,
     {"START": (7, 9), "END": (0.5, 2.5), "READY": (True, False)}),
    ("echo_str", {"START": "bool_false_true: [ false, true ]", "END": "int32_false_true: [ -1, 3 ]",
                  "READY": "fp32_false_true: [ 1, -4 ]"}, "TYPE_STRING", "session-a", b"session-a", 4,
     {"START": (False, True), "END": (-1, 3), "READY": (1.0, -4.0)}),
    ("echo_i32", {"START": "fp32_false_true: [ 0.25, 0.75 ]", "END": "bool_false_true: [ true, false ]",
                  "READY": "int32_false_true: [ 0, 5 ]"}, "TYPE_INT32", 2 ** 32 + 11, 11, 4,
     {"START": (0.25, 0.75), "END": (True, False), "READY": (0, 5)}),
    ("echo_nobatch", {"START": "int32_false_true: [ 0, 1 ]", "END": "int32_false_true: [ 0, 1 ]",
                      "READY": "int32_false_true: [ 0, 1 ]"}, "TYPE_INT64", 42, 42, 0,
     {"START": (0, 1), "END": (0, 1), "READY": (0, 1)}),
]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_control_inputs_reach_the_model_with_their_configured_values(serve, module) -> None:
    server = serve(*(echo_model(name, controls, corrid, batch) for name, controls, corrid, _, _, batch, _
                     in ECHO_CASES))
    for name, _, _, sequence_id, corrid_seen, max_batch_size, expected in ECHO_CASES:
        for step, (start, end) in enumerate([(True, False), (False, False), (False, True)]):
            result = infer(server, name, step + 1, sequence_id, start=start, end=end, module=module,
                           batched=max_batch_size > 0)
            where = (name, step)
            assert value(result, "START_ECHO") == expected["START"][start], where
            assert value(result, "END_ECHO") == expected["END"][end], where
            assert value(result, "READY_ECHO") == expected["READY"][True], where
            assert value(result, "CORRID_ECHO") == corrid_seen, where
            assert result.as_numpy("START_ECHO").shape == ((1, 1) if max_batch_size else (1,)), where


# ---- correlation ids, affinity and restarts ----------------------------------------------------

@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_interleaved_sequences_each_keep_their_total_on_one_instance(serve, module) -> None:
    server = serve(model_config("acc", ACCUMULATOR_CONTROLS, max_batch_size=2, instances=2, outputs=INSTANCE_OUTPUT))
    sequences = {1001: 1, 1002: 10, 1003: 100}
    totals = dict.fromkeys(sequences, 0)
    instances: dict[int, set[int]] = {sequence_id: set() for sequence_id in sequences}
    for step in range(4):
        for sequence_id, step_value in sequences.items():
            result = infer(server, "acc", step_value, sequence_id, start=step == 0, end=step == 3, module=module)
            totals[sequence_id] += step_value
            assert value(result) == totals[sequence_id], (sequence_id, step)
            instances[sequence_id].add(int(value(result, "INSTANCE")))
    assert all(len(seen) == 1 for seen in instances.values()), instances  # each sequence stayed on one instance
    assert set().union(*instances.values()) == {0, 1}  # and the sequences were spread over both
    assert int(stats(server, "acc")["execution_count"]) == 12


def test_start_on_an_active_sequence_restarts_it(serve) -> None:
    server = serve(model_config("acc", ACCUMULATOR_CONTROLS + state("initial_state { data_type: TYPE_INT32 "
                                "dims: [ 1 ] zero_data: true name: \"zero\" }")))
    assert value(infer(server, "acc", 5, 7, start=True)) == 5
    assert value(infer(server, "acc", 1, 7)) == 6
    assert value(infer(server, "acc", 2, 7, start=True)) == 2  # START again without END: a fresh sequence
    assert value(infer(server, "acc", 3, 7, end=True)) == 5


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_bad_sequence_requests_are_rejected_with_tritons_messages_and_other_sequences_go_on(serve, module) -> None:
    server = serve(model_config("acc", ACCUMULATOR_CONTROLS))
    assert value(infer(server, "acc", 4, 55, start=True, module=module)) == 4
    bad = {
        "inference request to model 'acc' must specify a non-zero or non-empty correlation ID":
            lambda: infer(server, "acc", 1, module=module),
        "inference request for sequence 77 to model 'acc' must specify the START flag on the first request of "
        "the sequence": lambda: infer(server, "acc", 1, 77, module=module),
        "inference request to model 'acc' must specify batch-size 1 due to requirements of sequence batcher":
            lambda: infer(server, "acc", 1, 55, rows=2, module=module),
        "has string correlation ID 'text', but the model's CORRID control input 'CORRID' is TYPE_UINT64":
            lambda: infer(server, "acc", 1, "text", start=True, module=module),
    }
    for message, call in bad.items():
        error = rejected(call)
        assert message in error.message(), error.message()
        assert error.status() == ("400" if module is httpclient else "StatusCode.INVALID_ARGUMENT")
    assert value(infer(server, "acc", 6, 55, end=True, module=module)) == 10  # sequence 55 was not disturbed


# ---- strategies and batching -------------------------------------------------------------------

def test_direct_runs_the_requests_of_different_sequences_as_one_batch(serve) -> None:
    direct = "direct { max_queue_delay_microseconds: 5000000 minimum_slot_utilization: 1.0 }"
    server = serve(model_config("direct", direct + ACCUMULATOR_CONTROLS, max_batch_size=3, delay_s=0.05))
    ids = [11, 12, 13]
    first = concurrently([lambda i=i: infer(server, "direct", i, i, start=True) for i in ids])
    second = concurrently([lambda i=i: infer(server, "direct", 1, i, end=True, module=grpcclient) for i in ids])
    assert [value(r) for r in first] == ids
    assert [value(r) for r in second] == [i + 1 for i in ids]
    model_stats = stats(server, "direct")
    assert int(model_stats["execution_count"]) == 2 and int(model_stats["inference_count"]) == 6
    assert batch_sizes(model_stats) == {3: 2}


def test_oldest_batches_across_sequences_up_to_the_preferred_size(serve) -> None:
    oldest = ("oldest { max_candidate_sequences: 4 preferred_batch_size: [ 3 ] "
              "max_queue_delay_microseconds: 5000000 }")
    server = serve(model_config("oldest", oldest + ACCUMULATOR_CONTROLS, max_batch_size=4, delay_s=0.05))
    ids = [21, 22, 23]
    first = concurrently([lambda i=i: infer(server, "oldest", i, i, start=True) for i in ids])
    second = concurrently([lambda i=i: infer(server, "oldest", 2, i, end=True) for i in ids])
    assert [value(r) for r in first] == ids and [value(r) for r in second] == [i + 2 for i in ids]
    assert batch_sizes(stats(server, "oldest")) == {3: 2}


def spec_and_pool(tmp_path: Path, text: str) -> tuple[ModelSpec, InstancePool]:
    spec = write_model(tmp_path, text)
    model = SequenceToyBackend().create_model(spec)  # its load and its instance's load do nothing
    instance = model.create_instance(InstanceSpec("m_0", ModelInstanceGroup(), 0, "CPU"))
    return spec, InstancePool(spec, [instance])


def request(model: str, corrid: int | str, start: bool = False, end: bool = False, number: int = 1) -> InferenceRequest:
    made = InferenceRequest(model, 1, inputs={"INPUT": Tensor("INPUT", "INT32", (1, 1), np.full((1, 1), number,
                                                                                             np.int32))})
    made.sequence_id, made.sequence_start, made.sequence_end = corrid, start, end
    return made


def test_oldest_takes_one_request_per_sequence_per_batch_and_honours_delay_scheduler(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")  # hold execution until 3 requests are queued
    spec, pool = spec_and_pool(tmp_path, model_config("held", "oldest { max_candidate_sequences: 4 }"
                                                      + ACCUMULATOR_CONTROLS, max_batch_size=4))

    async def scenario() -> list[int]:
        scheduler = SequenceBatcher(ModelContext(spec, pool, pool.stats, InferenceClient()))
        await scheduler.start()
        requests = [request("held", 1, start=True, number=1), request("held", 1, number=2),
                    request("held", 2, start=True, end=True, number=5)]
        for made in requests[:2]:
            scheduler.enqueue(made)
        await asyncio.sleep(0.05)
        assert "held" not in EXECUTIONS  # still held: only 2 queued
        scheduler.enqueue(requests[2])
        answers = [int(value_of(await made.single_response())) for made in requests]
        await scheduler.stop()
        return answers

    assert asyncio.run(scenario()) == [1, 3, 5]
    assert EXECUTIONS["held"] == [[(1, True, False), (2, True, True)], [(1, False, False)]]


def test_direct_waits_out_its_queue_delay_when_the_slots_stay_empty(tmp_path) -> None:
    """The instance's batcher sleeps until woken or the delay ends (asyncio.timeout expiring); when
    no other sequence comes, the timeout must send the lone request, not stop the batcher."""
    direct = "direct { max_queue_delay_microseconds: 100000 minimum_slot_utilization: 1.0 }"
    spec, pool = spec_and_pool(tmp_path, model_config("lone", direct + ACCUMULATOR_CONTROLS, max_batch_size=2))

    async def scenario() -> list[int]:
        scheduler = SequenceBatcher(ModelContext(spec, pool, pool.stats, InferenceClient()))
        await scheduler.start()
        requests = [request("lone", 7, start=True, number=4), request("lone", 7, end=True, number=5)]
        answers = []
        for made in requests:  # each one alone fills half the slots: it goes once the delay is over
            scheduler.enqueue(made)
            answers.append(int(value_of(await asyncio.wait_for(made.single_response(), 30))))
        await scheduler.stop()
        return answers

    assert asyncio.run(scenario()) == [4, 9]
    assert EXECUTIONS["lone"] == [[(7, True, False)], [(7, False, True)]]


def value_of(response: InferenceResponse) -> Any:
    assert response.error is None, response.error
    return response.outputs[0].data.reshape(-1)[0]


def test_stop_answers_every_accepted_request_and_then_refuses_new_sequences(tmp_path) -> None:
    spec, pool = spec_and_pool(tmp_path, model_config("stopping", ACCUMULATOR_CONTROLS, max_batch_size=1,
                                                      delay_s=0.02))

    async def scenario() -> None:
        scheduler = SequenceBatcher(ModelContext(spec, pool, pool.stats, InferenceClient()))
        await scheduler.start()
        requests = [request("stopping", 1, start=True), request("stopping", 1), request("stopping", 2, start=True)]
        for made in requests:
            scheduler.enqueue(made)  # sequence 2 waits in the backlog: the only slot is sequence 1's
        stopping = asyncio.ensure_future(scheduler.stop())
        await asyncio.sleep(0)
        with pytest.raises(ServerError) as caught:
            scheduler.enqueue(request("stopping", 3, start=True))
        assert caught.value.status is Status.UNAVAILABLE
        await stopping
        assert [made.finished for made in requests] == [True, True, True]

    asyncio.run(scenario())


def test_a_cancelled_request_leaves_the_state_of_the_other_sequences_in_its_batch_intact(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    spec, pool = spec_and_pool(tmp_path, model_config("cancel", state(), max_batch_size=2))

    async def scenario() -> tuple[Any, ...]:
        scheduler = SequenceBatcher(ModelContext(spec, pool, pool.stats, InferenceClient()))
        await scheduler.start()
        first_a, first_b = request("cancel", "a", start=True, number=1), request("cancel", "b", start=True, number=10)
        scheduler.enqueue(first_a)
        first_a.cancelled.set()  # the client went away while the request was queued
        scheduler.enqueue(first_b)
        cancelled, answered = await first_a.single_response(), await first_b.single_response()
        later_b, later_a = request("cancel", "b", number=1), request("cancel", "a", end=True, number=2)
        scheduler.enqueue(later_b)
        scheduler.enqueue(later_a)
        answers = (cancelled.error.status, value_of(answered), value_of(await later_b.single_response()),
                   value_of(await later_a.single_response()))
        await scheduler.stop()
        return answers

    assert asyncio.run(scenario()) == (Status.CANCELLED, 10, 11, 2)


# ---- idle sequences ----------------------------------------------------------------------------

def test_an_idle_sequence_is_released_for_the_backlog_and_must_start_again(serve) -> None:
    server = serve(model_config("idle", "max_sequence_idle_microseconds: 500000" + ACCUMULATOR_CONTROLS,
                                max_batch_size=1))
    assert value(infer(server, "idle", 1, 1, start=True)) == 1
    time.sleep(0.25)
    # The only slot is sequence 1's: sequence 2 waits in the backlog until sequence 1 has been idle 0.5 s.
    assert value(infer(server, "idle", 2, 2, start=True)) == 2
    assert value(infer(server, "idle", 3, 2, end=True)) == 5
    error = rejected(lambda: infer(server, "idle", 1, 1))
    assert "inference request for sequence 1 to model 'idle' must specify the START flag" in error.message()


# ---- implicit state ----------------------------------------------------------------------------

STATE_CASES = {
    "state_default": "",
    "state_zero": 'initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }',
    "state_file": 'initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred" name: "file" }',
}


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_implicit_state_carries_across_requests_and_stays_hidden(serve, module) -> None:
    configs = [model_config(name, state(initial), max_batch_size=2) for name, initial in STATE_CASES.items()]
    configs.append(model_config("state_visible", state(), outputs=', { name: "STATE_OUT" data_type: TYPE_INT32 '
                                "dims: [ 1 ] }"))
    server = serve(*configs, files={"state_file": {"initial_state/hundred": np.int32(100).tobytes()}})
    for name in STATE_CASES:
        base = 100 if name == "state_file" else 0
        totals = {"a": base, "b": base}
        for step in range(3):
            for sequence_id, step_value in (("a", 1), ("b", 10)):
                asked = ["OUTPUT"] if step % 2 else []  # asking for OUTPUT alone must not lose the state
                result = infer(server, name, step_value, sequence_id, start=step == 0, end=step == 2,
                               module=module, outputs=asked)
                totals[sequence_id] += step_value
                assert value(result) == totals[sequence_id], (name, sequence_id, step)
                assert result.as_numpy("STATE_OUT") is None  # not declared as an output: clients never see it
    visible = infer(server, "state_visible", 3, 9, start=True, module=module, outputs=["OUTPUT", "STATE_OUT"])
    assert value(visible, "STATE_OUT") == 3
    assert infer(server, "state_visible", 4, 9, module=module, outputs=["OUTPUT"]).as_numpy("STATE_OUT") is None
    assert value(infer(server, "state_visible", 1, 9, end=True, module=module)) == 8


def test_a_sequence_spread_over_front_end_processes_keeps_one_state(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(model_config("spread", state()), frontend_processes=2)
    totals = [value(infer(server, "spread", step, 77, start=step == 1, end=step == 20)) for step in range(1, 21)]
    assert totals == list(itertools.accumulate(range(1, 21)))  # one state, whichever process each request reached
    served = [process.endpoint.served for process in server.server.frontends.processes]
    assert all(count > 0 for count in served), served  # each request had its own connection


def test_grpc_stream_carries_interleaved_sequences(serve) -> None:
    server = serve(model_config("streamed", state(), max_batch_size=2))
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    plan = [("x", 1, True, False), (9, 5, True, False), ("x", 2, False, False), (9, 5, False, True),
            ("x", 3, False, True)]
    try:
        for number, (sequence_id, step_value, start, end) in enumerate(plan):
            tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.full((1, 1), step_value, np.int32))
            client.async_stream_infer("streamed", [tensor], request_id=str(number), sequence_id=sequence_id,
                                      sequence_start=start, sequence_end=end)
        answers = {}
        for _ in plan:
            result, error = results.get(timeout=10)
            assert error is None, error
            answers[int(result.get_response().id)] = int(value(result))
    finally:
        client.stop_stream()
    assert [answers[i] for i in range(len(plan))] == [1, 5, 3, 10, 6]


# ---- configuration errors ----------------------------------------------------------------------

@pytest.mark.parametrize("initial, message", [
    ('initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "z" }',
     "The data type used for 'initial_state' field of state 'STATE_IN' does not match the state data type."),
    ('initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }',
     "Field 'name' must be set when using initial_state for state input 'STATE_IN'."),
    ('initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "missing" name: "f" }',
     "failed to read initial_state data file"),
    ('initial_state { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true name: "z" }',
     "'initial_state' dim for input name 'STATE_IN' doesn't match 'state' dim description. 2 != 1"),
])
def test_a_bad_initial_state_fails_the_model_with_a_clear_error(tmp_path, initial, message) -> None:
    spec, pool = spec_and_pool(tmp_path, model_config("bad_state", state(initial)))
    with pytest.raises(ServerError) as caught:
        SequenceBatcher(ModelContext(spec, pool, pool.stats, InferenceClient()))
    assert message in caught.value.message
