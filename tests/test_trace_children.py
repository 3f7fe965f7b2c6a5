"""Child traces: the example repository's ensemble steps and BLS calls are traced as children of a traced
request (their own ids, ``parent_id``, the parent's level; OpenTelemetry spans under the parent's model
span), and the requests of an untraced one are not traced at all."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_serve.testing import EXAMPLE_REPOSITORY

from .test_trace import OtlpReceiver, attributes, read_json, stamp_names, trace_config, wait_for

CORE_STAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
               "COMPUTE_END", "REQUEST_END"]
STEPS = ["preprocess", "add_sub", "postprocess"]
CALLER_SPAN_ID = "b7ad6b7169242424"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP receiver on a loopback port (a fixture requested before the server: it outlives it)."""
    started = OtlpReceiver()
    yield started
    started.close()


def serve_examples(tserve: Any, *settings: str, frontend_processes: int = 0) -> Any:
    return tserve(EXAMPLE_REPOSITORY, model_control_mode="explicit", frontend_processes=frontend_processes,
                  load_models=["ensemble_add_sub", "bls_add_sub"], trace_config=trace_config(*settings))


def infer_ensemble(url: str, request_id: str, headers: dict[str, str] | None = None) -> None:
    raw = httpclient.InferInput("RAW", [1, 16], "FP32")
    raw.set_data_from_numpy(np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16))
    result = httpclient.InferenceServerClient(url).infer("ensemble_add_sub", [raw], request_id=request_id,
                                                         headers=headers)
    assert result.as_numpy("RAW_PLUS_ONE") is not None


def infer_bls(url: str, request_id: str, headers: dict[str, str] | None = None) -> None:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.full((1, 16), 3, np.int32))
        inputs.append(tensor)
    with grpcclient.InferenceServerClient(url) as client:
        result = client.infer("bls_add_sub", inputs, request_id=request_id, headers=headers)
    assert result.as_numpy("OUTPUT0").tolist() == [[6] * 16]


def traces_by_id(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    found: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        found.setdefault(record["id"], []).append(record)
    return found


def model_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [record for record in records if "model_name" in record]
    return found


def stamp(records: list[dict[str, Any]], name: str) -> int:
    (ns,) = [r["timestamps"][0]["ns"] for r in records if "timestamps" in r and r["timestamps"][0]["name"] == name]
    return ns


def test_ensemble_steps_and_bls_calls_have_child_traces(tserve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "trace.json"
    # Every 2nd request the front-ends receive is traced; one trace and its children go to each file.
    server = serve_examples(tserve, "level=TIMESTAMPS", "level=TENSORS", "rate=2", f"triton,file={path}",
                            "triton,log-frequency=1")
    infer_ensemble(server.http_url, "ensemble-untraced")
    infer_ensemble(server.http_url, "ensemble-traced")
    infer_bls(server.grpc_url, "bls-untraced")
    infer_bls(server.grpc_url, "bls-traced")
    ensemble = traces_by_id(wait_for(lambda: read_json(Path(f"{path}.0")), "the ensemble's traces"))
    bls = traces_by_id(wait_for(lambda: read_json(Path(f"{path}.1")), "the BLS model's traces"))

    # The ensemble's trace, then one child per step, in the order they ran, each with the step's model.
    parent_id, *step_ids = sorted(ensemble)
    assert model_record(ensemble[parent_id]) == {"id": parent_id, "model_name": "ensemble_add_sub",
                                                 "model_version": 1, "request_id": "ensemble-traced"}
    assert [model_record(ensemble[i]) for i in step_ids] == [
        {"id": i, "model_name": name, "model_version": 1, "request_id": "ensemble-traced", "parent_id": parent_id}
        for i, name in zip(step_ids, STEPS)]
    for step_id in step_ids:
        records = ensemble[step_id]
        assert stamp_names(records) == CORE_STAMPS
        assert stamp(ensemble[parent_id], "REQUEST_START") <= stamp(records, "REQUEST_START")
        assert stamp(records, "REQUEST_END") <= stamp(ensemble[parent_id], "REQUEST_END")
    # The parent's TENSORS level: the add_sub step's inputs and outputs.
    add_sub = sorted((r["activity"], r["tensor"]["name"]) for r in ensemble[step_ids[1]] if "activity" in r)
    assert add_sub == [("TENSOR_BACKEND_OUTPUT", "OUTPUT0"), ("TENSOR_BACKEND_OUTPUT", "OUTPUT1"),
                       ("TENSOR_QUEUE_INPUT", "INPUT0"), ("TENSOR_QUEUE_INPUT", "INPUT1")]

    # The BLS model's trace and its call's child (which has no request id of its own).
    bls_id, call_id = sorted(bls)
    assert model_record(bls[bls_id]) == {"id": bls_id, "model_name": "bls_add_sub", "model_version": 1,
                                         "request_id": "bls-traced"}
    assert model_record(bls[call_id]) == {"id": call_id, "model_name": "add_sub", "model_version": 1,
                                          "parent_id": bls_id}
    assert stamp_names(bls[call_id]) == CORE_STAMPS
    assert stamp(bls[bls_id], "COMPUTE_START") <= stamp(bls[call_id], "REQUEST_START")
    assert stamp(bls[call_id], "REQUEST_END") <= stamp(bls[bls_id], "COMPUTE_END")

    # The untraced requests' steps and calls were neither traced nor counted by the rate (else the traced
    # requests would not have been the 2nd and 4th, and more files would exist).
    assert not Path(f"{path}.2").exists() and not path.exists()


def test_child_spans_sit_under_their_parents_model_span(receiver: OtlpReceiver,
                                                        tserve) -> None:  # type: ignore[no-untyped-def]
    # rate=0: only the requests that carry a trace context are traced.
    server = serve_examples(tserve, "mode=opentelemetry", "level=TIMESTAMPS", "rate=0",
                            f"opentelemetry,url={receiver.url}", "opentelemetry,bsp_schedule_delay=50",
                            frontend_processes=2)
    infer_ensemble(server.http_url, "ensemble-untraced")
    infer_bls(server.grpc_url, "bls-untraced")
    callers = {"ensemble": "1" * 32, "bls": "2" * 32}
    infer_ensemble(server.http_url, "ensemble", {"traceparent": f"00-{callers['ensemble']}-{CALLER_SPAN_ID}-01"})
    infer_bls(server.grpc_url, "bls", {"traceparent": f"00-{callers['bls']}-{CALLER_SPAN_ID}-01"})
    # Compute spans: one per step, one for the BLS model and one for its call.
    wait_for(lambda: sum(span.name == "compute" for _, span in receiver.spans) == 5, "every trace's spans")
    assert {span.trace_id.hex() for _, span in receiver.spans} == set(callers.values())

    def spans_of(trace_id: str) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        for _, span in receiver.spans:
            if span.trace_id.hex() == trace_id:
                found.setdefault(span.name, []).append(span)
        return found

    def check_child(child: Any, parent: Any, name: str, compute: list[Any]) -> None:
        assert child.parent_span_id == parent.span_id and child.kind == child.SPAN_KIND_SERVER
        assert attributes(child)["triton.model_name"] == name
        assert attributes(child)["triton.trace_parent_id"] == attributes(parent)["triton.trace_id"]
        assert [event.name for event in child.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        (own,) = [span for span in compute if span.parent_span_id == child.span_id]
        assert [event.name for event in own.events] == CORE_STAMPS[2:-1]

    spans = spans_of(callers["ensemble"])
    assert sorted(spans) == sorted(["InferRequest", "ensemble_add_sub", "compute", *STEPS])
    (root,), (ensemble,) = spans["InferRequest"], spans["ensemble_add_sub"]
    assert root.parent_span_id.hex() == CALLER_SPAN_ID and ensemble.parent_span_id == root.span_id
    assert attributes(ensemble)["triton.trace_parent_id"] == 0
    assert len(spans["compute"]) == 3  # the steps'; the ensemble itself computes nothing
    for name in STEPS:
        (step,) = spans[name]
        check_child(step, ensemble, name, spans["compute"])
        assert attributes(step)["triton.request_id"] == "ensemble"

    spans = spans_of(callers["bls"])
    assert sorted(spans) == ["InferRequest", "add_sub", "bls_add_sub", "compute"]
    (root,), (bls,), (call,) = spans["InferRequest"], spans["bls_add_sub"], spans["add_sub"]
    assert root.parent_span_id.hex() == CALLER_SPAN_ID and bls.parent_span_id == root.span_id
    check_child(call, bls, "add_sub", spans["compute"])
    assert len(spans["compute"]) == 2

