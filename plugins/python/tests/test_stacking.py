"""Several requests given to one instance at once (as a batcher does): without ``stack_requests`` model.py
gets them all in one execute call; with it, one request with stacked inputs; bad settings fail the load."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from triton_serve.plugin import (InferenceRequest, InferenceResponse, InstanceSpec, ModelConfig, ModelInstanceGroup,
                                 ModelSpec, RequestedOutput, ServerError, Status, Tensor, model_parameters)
from triton_serve_python.backend import PythonBackend
from triton_serve_python.options import PythonBackendOptions
from triton_serve_python.stacking import stacks_requests

CONFIG = """
    name: "reporter"
    backend: "python"
    max_batch_size: 8
    input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]
    output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] },
             { name: "REQUESTS", data_type: TYPE_INT32, dims: [ 1 ] },
             { name: "ROWS", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""
STACKED = 'parameters { key: "stack_requests", value: { string_value: "true" } }\n'
SIZES = (1, 2, 3)


def _rows(request: int, count: int) -> np.ndarray:
    """``count`` rows of X that tell requests apart: request 2's values are 200, 201, ..."""
    return (np.arange(count * 2, dtype=np.float32) + 100 * request).reshape(count, 2)


def _request(x: np.ndarray, outputs: Sequence[str] = ()) -> InferenceRequest:
    return InferenceRequest("reporter", 1, inputs={"X": Tensor("X", "FP32", x.shape, x)},
                            outputs=[RequestedOutput(name) for name in outputs])


def _execute(kit: Any, tmp_path: Path, shm_prefix: str, config: str, xs: Sequence[np.ndarray],
             outputs: Sequence[Sequence[str]] = (), model_py: str = "") -> Sequence[InferenceResponse]:
    """Load one instance of the reporter model (or ``model_py``), execute ``xs`` as one batch of requests on
    it, unload it."""
    model_dir = kit.write_model(tmp_path, "reporter", model_py or kit.batch_reporter_model)
    spec = ModelSpec("reporter", 1, text_format.Parse(config, ModelConfig()), model_dir, model_dir / "1", "model.py")
    backend = PythonBackend(PythonBackendOptions(shm_region_prefix_name=shm_prefix))
    spec.parameters = model_parameters(backend, spec)  # as the core does
    model = backend.create_model(spec)

    async def run() -> Sequence[InferenceResponse]:
        await model.load()
        instance = model.create_instance(InstanceSpec("reporter_0_0", ModelInstanceGroup(), 0, "CPU"))
        await instance.load()
        try:
            wanted = list(outputs) or [()] * len(xs)
            return await instance.execute([_request(x, names) for x, names in zip(xs, wanted)])
        finally:
            await instance.unload()
            await model.unload()

    return asyncio.run(run())


def _output(response: InferenceResponse, name: str) -> np.ndarray | None:
    tensor = response.output(name)
    return None if tensor is None else tensor.data


def test_one_execute_call_gets_every_request(kit: Any, tmp_path: Path, shm_prefix: str) -> None:
    xs = [_rows(request, size) for request, size in enumerate(SIZES)]
    responses = _execute(kit, tmp_path, shm_prefix, CONFIG, xs)
    assert len(responses) == 3
    for x, response in zip(xs, responses):
        np.testing.assert_array_equal(_output(response, "Y"), x * 2)
        np.testing.assert_array_equal(_output(response, "REQUESTS"), np.full((len(x), 1), 3))
        np.testing.assert_array_equal(_output(response, "ROWS"), np.full((len(x), 1), len(x)))
        assert response.parameters == {"rows": len(x)}


def test_stacked_requests_reach_the_model_as_one(kit: Any, tmp_path: Path, shm_prefix: str) -> None:
    xs = [_rows(request, size) for request, size in enumerate(SIZES)]
    responses = _execute(kit, tmp_path, shm_prefix, CONFIG + STACKED, xs, [["Y"], [], ["ROWS", "Y"]])
    assert len(responses) == 3
    for x, response in zip(xs, responses):
        np.testing.assert_array_equal(_output(response, "Y"), x * 2)  # exactly this request's rows
        assert response.parameters == {"rows": 6}  # the stacked response's parameters, for every request
    assert [tensor.name for tensor in responses[0].outputs] == ["Y"]  # only what each request asked for
    np.testing.assert_array_equal(_output(responses[1], "REQUESTS"), np.ones((2, 1)))  # one request...
    np.testing.assert_array_equal(_output(responses[1], "ROWS"), np.full((2, 1), 6))  # ...of all 6 rows
    assert sorted(tensor.name for tensor in responses[2].outputs) == ["ROWS", "Y"]
    assert kit.shm_entries(shm_prefix) == []  # unloading the instance removed its arenas


def test_stacked_error_response_fails_the_batch(kit: Any, tmp_path: Path, shm_prefix: str) -> None:
    with pytest.raises(ServerError) as raised:
        _execute(kit, tmp_path, shm_prefix, CONFIG + STACKED, [_rows(0, 1), -_rows(1, 2)])
    assert (raised.value.status, raised.value.message) == (Status.INVALID_ARG, "X holds a negative value")


SENDER_MODEL = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]),
                                                   flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""


def test_stacked_request_answered_through_its_sender_fails_the_batch(kit: Any, tmp_path: Path,
                                                                     shm_prefix: str) -> None:
    with pytest.raises(ServerError) as raised:
        _execute(kit, tmp_path, shm_prefix, CONFIG + STACKED, [_rows(0, 1), _rows(1, 2)], model_py=SENDER_MODEL)
    assert raised.value.status == Status.INTERNAL
    assert "with 'stack_requests' on, execute must return the stacked request's response" in raised.value.message


def test_stacked_outputs_must_keep_the_batch_dimension(kit: Any, tmp_path: Path, shm_prefix: str) -> None:
    with pytest.raises(ServerError) as raised:
        _execute(kit, tmp_path, shm_prefix, CONFIG + STACKED, [_rows(0, 1), _rows(20, 2)])
    assert raised.value.status == Status.INTERNAL
    assert raised.value.message == ("model 'reporter' returned output 'Y' with shape [2, 2] for a batch of 3; "
                                    "its first dimension must be the batch")


@pytest.mark.parametrize(("parameters", "stacks"), [
    ("", False),
    ('parameters { key: "stack_requests", value: { string_value: "false" } }', False),
    ('parameters { key: "stack_requests", value: { string_value: "True" } }', True),
])
def test_stack_requests_is_opt_in(parameters: str, stacks: bool) -> None:
    assert stacks_requests(_spec(CONFIG + parameters)) is stacks


def _spec(config: str) -> ModelSpec:
    spec = ModelSpec("reporter", 1, text_format.Parse(config, ModelConfig()), Path("reporter"), Path("reporter/1"))
    spec.parameters = model_parameters(PythonBackend(), spec)
    return spec


@pytest.mark.parametrize(("config", "words"), [
    (CONFIG + 'parameters { key: "stack_requests", value: { string_value: "maybe" } }',
     "backend 'python': model 'reporter' parameter 'stack_requests' has invalid value 'maybe': expected true/false, "
     "on/off or 1/0"),
    (CONFIG.replace("max_batch_size: 8", "max_batch_size: 0") + STACKED,
     "parameters of python model 'reporter': 'stack_requests' needs max_batch_size > 0"),
    (CONFIG + STACKED + "sequence_batching { }",
     "parameters of python model 'reporter': 'stack_requests' cannot be used with sequence_batching"),
    (CONFIG + STACKED + "model_transaction_policy { decoupled: true }",
     "parameters of python model 'reporter': 'stack_requests' cannot be used with a decoupled model"),
])
def test_invalid_stack_requests_settings_are_refused(config: str, words: str) -> None:
    with pytest.raises(ServerError) as raised:
        stacks_requests(_spec(config))
    assert raised.value.status == Status.INVALID_ARG
    assert words in raised.value.message


def test_invalid_stack_requests_fails_the_load_with_the_reason(kit: Any, tmp_path: Path, python_server: Any,
                                                               client_for: Any) -> None:
    body = CONFIG.replace('name: "reporter"\n    backend: "python"\n', "")
    kit.write_model(tmp_path, "bad_value", kit.batch_reporter_model,
                    body + 'parameters { key: "stack_requests", value: { string_value: "maybe" } }')
    kit.write_model(tmp_path, "not_batching", kit.batch_reporter_model, body.replace("max_batch_size: 8", "max_batch_size: 0")
                    + STACKED)
    kit.write_model(tmp_path, "stacked", kit.batch_reporter_model, body + STACKED)
    client = client_for(python_server(tmp_path))
    reasons = {entry["name"]: entry.get("reason", "") for entry in client.get_model_repository_index()
               if entry.get("state") != "READY"}
    assert set(reasons) == {"bad_value", "not_batching"}
    assert ("backend 'python': model 'bad_value' parameter 'stack_requests' has invalid value 'maybe': expected "
            "true/false, on/off or 1/0") in reasons["bad_value"]
    assert "parameters of python model 'not_batching': 'stack_requests' needs max_batch_size > 0" \
        in reasons["not_batching"]
    assert client.is_model_ready("stacked")
