"""Ensembles with the Python backend's decoupled models and BLS: an ensemble whose step streams, and a
Python model that calls an ensemble through BLS."""
from __future__ import annotations

import json
import queue
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_serve.testing import EXAMPLE_REPOSITORY

STREAM_TEXT = """
name: "stream_text"
platform: "ensemble"
max_batch_size: 0
input [ { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "token_streamer" model_version: -1
  input_map { key: "text_input" value: "text_input" } output_map { key: "text_output" value: "text_output" } } ] }
"""
BLS_CONFIG = """
name: "bls_ensemble"
backend: "python"
max_batch_size: 8
input [ { name: "RAW", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "RAW_PLUS_ONE", data_type: TYPE_FP32, dims: [ 16 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
BLS_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            answer = pb_utils.InferenceRequest(
                model_name="ensemble_add_sub", inputs=[pb_utils.get_input_tensor_by_name(request, "RAW")],
                requested_output_names=["RAW_PLUS_ONE"]).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=answer.output_tensors()))
        return responses
'''


def repository(root: Path) -> Path:
    for name in ("token_streamer", "ensemble_add_sub", "preprocess", "add_sub", "postprocess"):
        shutil.copytree(EXAMPLE_REPOSITORY / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "stream_text" / "1").mkdir(parents=True)
    (root / "stream_text" / "config.pbtxt").write_text(STREAM_TEXT)
    (root / "bls_ensemble" / "1").mkdir(parents=True)
    (root / "bls_ensemble" / "config.pbtxt").write_text(BLS_CONFIG)
    (root / "bls_ensemble" / "1" / "model.py").write_text(BLS_MODEL)
    return root


def test_a_streaming_step_and_bls_into_an_ensemble(tserve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = tserve(repository(tmp_path / "models"), model_control_mode="explicit",
                    load_models=["stream_text", "bls_ensemble", "ensemble_add_sub"])
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    received: queue.Queue[Any] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: received.put(error or result))
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"one two three"], dtype=object))
    grpc.async_stream_infer("stream_text", [text], enable_empty_final_response=True)
    tokens = []
    while True:
        result = received.get(timeout=60)
        assert not isinstance(result, Exception), result
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
        tokens.append(result.as_numpy("text_output")[0])
    grpc.stop_stream()
    assert tokens == [b"one", b" two", b" three"]

    events = []
    with httpx.stream("POST", f"http://{server.http_url}/v2/models/stream_text/generate_stream",
                      json={"text_input": "four five"}, timeout=60) as response:
        assert response.status_code == 200
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    assert [event["text_output"] for event in events] == ["four", " five"]

    raw = httpclient.InferInput("RAW", [1, 16], "FP32")
    values = np.arange(16, dtype=np.float32).reshape(1, 16)
    raw.set_data_from_numpy(values)
    answer = httpclient.InferenceServerClient(server.http_url).infer("bls_ensemble", [raw])
    np.testing.assert_allclose(answer.as_numpy("RAW_PLUS_ONE"), values + 1, atol=0.01)
