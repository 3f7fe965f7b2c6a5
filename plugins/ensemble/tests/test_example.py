"""The example repository's ensemble_add_sub (Python preprocess -> Python add_sub -> Python postprocess),
loaded alone in explicit mode, which loads its three models, answers tritonclient HTTP, gRPC and gRPC streams."""
from __future__ import annotations

import queue
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_serve.testing import EXAMPLE_REPOSITORY

RAW = np.linspace(-1.5, 2.25, 16, dtype=np.float32).reshape(1, 16)


def raw(client: Any) -> Any:
    tensor = client.InferInput("RAW", [1, 16], "FP32")
    tensor.set_data_from_numpy(RAW)
    return tensor


def test_the_example_ensemble_serves_every_client(tserve) -> None:  # type: ignore[no-untyped-def]
    server = tserve(EXAMPLE_REPOSITORY, model_control_mode="explicit", load_models=["ensemble_add_sub"])
    http = httpclient.InferenceServerClient(server.http_url)
    ready = {m["name"] for m in http.get_model_repository_index() if m.get("state") == "READY"}
    assert ready == {"ensemble_add_sub", "preprocess", "add_sub", "postprocess"}

    result = http.infer("ensemble_add_sub", [raw(httpclient)])
    np.testing.assert_allclose(result.as_numpy("RAW_PLUS_ONE"), RAW + 1, atol=0.01)
    np.testing.assert_allclose(result.as_numpy("RAW_MINUS_ONE"), RAW - 1, atol=0.01)

    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    answer = grpc.infer("ensemble_add_sub", [raw(grpcclient)])
    np.testing.assert_allclose(answer.as_numpy("RAW_PLUS_ONE"), RAW + 1, atol=0.01)

    received: queue.Queue[Any] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: received.put(error or result))
    grpc.async_stream_infer("ensemble_add_sub", [raw(grpcclient)], request_id="s1")
    streamed = received.get(timeout=60)
    grpc.stop_stream()
    np.testing.assert_allclose(streamed.as_numpy("RAW_MINUS_ONE"), RAW - 1, atol=0.01)

    body = {"inputs": [{"name": "RAW", "datatype": "FP32", "shape": [1, 16], "data": list(range(16))}]}
    answer = httpx.post(f"http://{server.http_url}/v2/models/ensemble_add_sub/infer", json=body, timeout=30).json()
    outputs = {output["name"]: output["data"] for output in answer["outputs"]}
    assert outputs["RAW_PLUS_ONE"] == [v + 1 for v in range(16)]  # the README's curl call

    stats = {s["name"]: s for s in http.get_inference_statistics()["model_stats"]}
    for name in ("ensemble_add_sub", "preprocess", "add_sub", "postprocess"):
        assert stats[name]["inference_stats"]["success"]["count"] == 4, name
