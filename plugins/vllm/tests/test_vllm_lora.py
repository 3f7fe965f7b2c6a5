"""LoRA adapters as Triton's vLLM backend serves them: conftest.py's model has ``"enable_lora": true`` and a
``multi_lora.json`` naming two adapters made at test time (``alpha``, ``beta``), picked per request by ``lora_name``,
through the generate endpoint and tritonclient gRPC streaming."""
from __future__ import annotations

import json
import queue
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer

MODEL = "llm"  # conftest.py's model
PROMPT = "Hello there"
GREEDY = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}
WAIT_S = 120


def _generate(http_url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"http://{http_url}/v2/models/{MODEL}/generate",
                      json={"text_input": PROMPT, "exclude_input_in_output": True, **body}, timeout=WAIT_S)


def _greedy(http_url: str, **extra: Any) -> str:
    answer = _generate(http_url, {"sampling_parameters": json.dumps({**GREEDY, **extra})})
    assert answer.status_code == 200, answer.text
    text = answer.json()["text_output"]
    assert text != ""
    return text


@pytest.fixture(scope="module")
def greedy_texts(http_url: str) -> dict[str | None, str]:
    """The prompt's greedy text without an adapter and with each (one request each, alone)."""
    return {name: _greedy(http_url, **({"lora_name": name} if name else {})) for name in (None, "alpha", "beta")}


def test_an_adapter_changes_the_greedy_text_and_gives_the_same_text_again(
        http_url: str, greedy_texts: dict[str | None, str]) -> None:
    assert len(set(greedy_texts.values())) == 3  # each adapter changes the model, and they differ
    assert _greedy(http_url, lora_name="alpha") == greedy_texts["alpha"]
    assert _greedy(http_url) == greedy_texts[None]  # the adapter was for that request only
    # the request's parameters (the generate extension's) name an adapter too
    answer = _generate(http_url, {"parameters": {**GREEDY, "lora_name": "beta"}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["text_output"] == greedy_texts["beta"]


def _stream_inputs(lora_name: str | None) -> list[grpcclient.InferInput]:
    values = {"text_input": PROMPT, "sampling_parameters": json.dumps(
        {**GREEDY, **({"lora_name": lora_name} if lora_name else {})})}
    tensors = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, [1], "BYTES")
        tensor.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
        tensors.append(tensor)
    stream = grpcclient.InferInput("stream", [1], "BOOL")
    stream.set_data_from_numpy(np.array([True]))
    return [*tensors, stream]


def test_grpc_stream_requests_with_and_without_adapters_batched_together(
        server: RunningServer, greedy_texts: dict[str | None, str]) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        names = {"base": None, "alpha": "alpha", "beta": "beta", "unknown": "gamma"}
        for request_id, lora_name in names.items():  # sent together: vLLM runs them in one batch
            client.async_stream_infer(MODEL, _stream_inputs(lora_name), request_id=request_id,
                                      enable_empty_final_response=True)
        texts: dict[str, str] = {}
        error = None
        open_requests = {"base", "alpha", "beta"}
        while open_requests or error is None:
            item = results.get(timeout=WAIT_S)
            if isinstance(item, InferenceServerException):
                assert error is None, item
                error = item
                continue
            response = item.get_response()
            output = item.as_numpy("text_output")  # None in the empty final response
            texts[response.id] = texts.get(response.id, "") + (output[0].decode() if output is not None else "")
            if response.parameters["triton_final_response"].bool_param:
                open_requests.discard(response.id)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    assert texts == {"base": greedy_texts[None], "alpha": greedy_texts["alpha"], "beta": greedy_texts["beta"]}
    assert error.message() == "LoRA gamma is not supported, we currently support ['alpha', 'beta']"


def test_an_unknown_adapter_is_refused_with_tritons_message(http_url: str) -> None:
    answer = _generate(http_url, {"sampling_parameters": json.dumps({"lora_name": "gamma"})})
    assert answer.status_code == 400
    assert answer.json()["error"] == "LoRA gamma is not supported, we currently support ['alpha', 'beta']"
