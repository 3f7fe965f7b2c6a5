"""Cancelling an ensemble request cancels the step requests it has in flight, and later steps never run."""
from __future__ import annotations

import asyncio
import queue
from collections.abc import Sequence

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.plugin import (Backend, BackendRegistry, InferenceRequest, InferenceResponse, InstanceSpec, Model,
                                 ModelInstance, ModelSpec, hookimpl)

HELD = """
backend: "held"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
IDENTITY = HELD.replace('"held"', '"toy_identity"')
PIPELINE = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "held" model_version: -1
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "identity" model_version: -1
    input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""
STARTED: queue.Queue[str] = queue.Queue()
CANCELLED: queue.Queue[str] = queue.Queue()


class _HeldInstance(ModelInstance):
    """Holds each request until it is cancelled (at most 20 s), then answers it."""

    async def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse]:
        for request in requests:
            STARTED.put(request.id)
        for _ in range(200):
            if all(request.cancelled.is_set() for request in requests):
                break
            await asyncio.sleep(0.1)
        for request in requests:
            if request.cancelled.is_set():
                CANCELLED.put(request.id)
        return [InferenceResponse([request.inputs["INPUT0"]]) for request in requests]


class _HeldModel(Model):
    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return _HeldInstance(self, instance)


class HeldBackend(Backend):
    name = "held"

    def create_model(self, spec: ModelSpec) -> Model:
        return _HeldModel(self, spec)


class HeldPlugin:
    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(HeldBackend)


def test_a_cancelled_ensemble_request_cancels_its_running_step(add_model, serve) -> None:  # type: ignore[no-untyped-def]
    add_model("held", HELD)
    add_model("identity", IDENTITY)
    add_model("pipeline", PIPELINE)
    server = serve(("held", HeldPlugin()))
    value = grpcclient.InferInput("IN", [1], "INT32")
    value.set_data_from_numpy(np.array([7], np.int32))
    with pytest.raises(InferenceServerException, match="Deadline"):
        grpcclient.InferenceServerClient(server.grpc_url).infer("pipeline", [value], request_id="r1", client_timeout=1)
    assert STARTED.get(timeout=20) == "r1"
    assert CANCELLED.get(timeout=20) == "r1"  # the step saw its request cancelled while running
    http = httpclient.InferenceServerClient(server.http_url)
    stats = {s["name"]: s for s in http.get_inference_statistics()["model_stats"]}
    assert stats["pipeline"]["inference_stats"]["fail"]["count"] == 2  # as Triton counts a failed ensemble request
    assert stats["identity"]["inference_stats"]["success"]["count"] == 0  # the next step never ran
    assert stats["identity"]["inference_stats"]["fail"]["count"] == 0
