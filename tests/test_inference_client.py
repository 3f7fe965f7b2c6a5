"""The in-process client schedulers and backends get: requests to other models take the one inference path."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from triton_serve.plugin import (Backend, BackendRegistry, InferenceRequest, InferenceResponse, InstanceSpec, Model,
                                 ModelInstance, ModelSpec, Tensor, hookimpl)

IDENTITY = """
backend: "toy_identity"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_FP32 dims: [2] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }
"""
RELAY = """
backend: "relay"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_FP32 dims: [2] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }
"""


class _RelayInstance(ModelInstance):
    """Sends each request's INPUT0 doubled to model "identity" and answers with its output."""

    async def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse]:
        responses = []
        for request in requests:
            doubled = request.inputs["INPUT0"].data * 2
            inner = InferenceRequest("identity", inputs={"INPUT0": Tensor("INPUT0", "FP32", (2,), doubled)})
            answer = await self.model.spec.client.infer(inner)
            responses.append(InferenceResponse([answer.outputs[0]]))
        return responses


class _RelayModel(Model):
    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return _RelayInstance(self, instance)


class RelayBackend(Backend):
    name = "relay"

    def create_model(self, spec: ModelSpec) -> Model:
        return _RelayModel(self, spec)


class RelayPlugin:
    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(RelayBackend)


def test_a_model_calls_another_through_the_inference_path(add_model, tserve, repo, toy_plugin) -> None:  # type: ignore[no-untyped-def]
    add_model("identity", IDENTITY)
    add_model("relay", RELAY)
    server = tserve(repo, extra_plugins=[("toy", toy_plugin), ("relay", RelayPlugin())])
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1.5, -2.0], np.float32))
    assert client.infer("relay", [tensor]).as_numpy("OUTPUT0").tolist() == [3.0, -4.0]
    stats: dict[str, Any] = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    assert stats["identity"]["inference_stats"]["success"]["count"] == 1  # the inner request was counted


def test_an_ensemble_runs_its_steps_through_the_inference_path(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("identity", IDENTITY)
    add_model("pipeline", 'platform: "ensemble"\nmax_batch_size: 0\n'
                          'input { name: "IN" data_type: TYPE_FP32 dims: [2] }\n'
                          'output { name: "OUT" data_type: TYPE_FP32 dims: [2] }\n'
                          'ensemble_scheduling { step { model_name: "identity" model_version: -1 '
                          'input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } }')
    client = httpclient.InferenceServerClient(toy_server().http_url)
    tensor = httpclient.InferInput("IN", [2], "FP32")
    tensor.set_data_from_numpy(np.array([0.5, 4.0], np.float32))
    assert client.infer("pipeline", [tensor]).as_numpy("OUT").tolist() == [0.5, 4.0]
    stats: dict[str, Any] = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    assert stats["identity"]["inference_stats"]["success"]["count"] == 1  # the step went through the data plane
