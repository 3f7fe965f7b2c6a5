"""Triton's vLLM contract through tritonclient gRPC streaming and the generate endpoints, cancellation, and the
vllm: metrics, against one real vLLM engine (conftest.py)."""
from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer
from triton_serve_vllm.engine_client import EngineClient


MODEL = "llm"  # conftest.py's model
MAX_MODEL_LEN = 8192  # its model.json's max_model_len
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # the random model samples them too; the text leaves them out
WAIT_S = 120  # a bound on every wait: generous, two busy cores


def _inputs(prompt: str, **values: Any) -> list[grpcclient.InferInput]:
    tensors = []
    for name, value in {"text_input": prompt, **values}.items():
        if isinstance(value, (dict, str)):
            data, datatype = np.array([(json.dumps(value) if isinstance(value, dict) else value).encode()],
                                      dtype=np.object_), "BYTES"
        else:
            data, datatype = np.array([value], dtype=bool), "BOOL"
        tensor = grpcclient.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


@pytest.fixture
def grpc_stream(server: RunningServer) -> Iterator[tuple[grpcclient.InferenceServerClient, queue.Queue[Any]]]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error or result))
    yield client, results
    client.stop_stream(cancel_requests=True)
    client.close()


def _until_final(results: queue.Queue[Any]) -> list[Any]:
    """The stream's responses up to its final one (the stream must end)."""
    responses = []
    while True:
        item = results.get(timeout=WAIT_S)
        assert not isinstance(item, InferenceServerException), item
        responses.append(item)
        if item.get_response().parameters["triton_final_response"].bool_param:
            return responses


def _generate(http_url: str, body: dict[str, Any], stream: bool = False) -> httpx.Response:
    path = "generate_stream" if stream else "generate"
    return httpx.post(f"http://{http_url}/v2/models/{MODEL}/{path}", json=body, timeout=WAIT_S)


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in response.text.splitlines() if line.startswith("data: ")]


def test_auto_complete_gives_the_contract_and_the_tokenizer(server: RunningServer) -> None:
    config = httpclient.InferenceServerClient(server.http_url).get_model_config(MODEL)
    assert [spec["name"] for spec in config["input"]] == [
        "text_input", "image", "stream", "sampling_parameters", "exclude_input_in_output", "return_finish_reason",
        "return_cumulative_logprob", "return_logprobs", "return_num_input_tokens", "return_num_output_tokens",
        "embedding_request"]
    assert {spec["name"] for spec in config["output"]} == {
        "text_output", "finish_reason", "cumulative_logprob", "logprobs", "num_input_tokens", "num_output_tokens"}
    assert config["model_transaction_policy"]["decoupled"] is True
    assert config["max_batch_size"] == 0
    assert config["parameters"]["tokenizer"]["string_value"].endswith("/1/weights")


def test_grpc_streaming_spells_the_greedy_text_token_by_token(
        grpc_stream: tuple[grpcclient.InferenceServerClient, queue.Queue[Any]], http_url: str) -> None:
    client, results = grpc_stream
    parameters = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
    client.async_stream_infer(MODEL, _inputs("Hello there", stream=True, sampling_parameters=parameters,
                                             return_finish_reason=True, return_num_output_tokens=True,
                                             return_num_input_tokens=True), enable_empty_final_response=True)
    responses = _until_final(results)
    streamed = "".join(item.as_numpy("text_output")[0].decode() for item in responses)
    assert sum(int(item.as_numpy("num_output_tokens")[0]) for item in responses) == 12
    assert [item.as_numpy("finish_reason")[0] for item in responses][-1] == b"length"
    assert all(item.as_numpy("finish_reason")[0] == b"" for item in responses[:-1])
    assert responses[0].as_numpy("num_input_tokens")[0] == len("Hello there")  # one token per character
    whole = _generate(http_url, {"text_input": "Hello there", "exclude_input_in_output": True,
                                 "sampling_parameters": json.dumps(parameters)})
    assert whole.status_code == 200, whole.text
    assert whole.json()["text_output"] == streamed != ""


def test_generate_puts_the_prompt_first_by_default_and_takes_request_parameters(http_url: str) -> None:
    answer = _generate(http_url, {"text_input": "Hi", "return_finish_reason": True, "id": "r1",
                                  "parameters": {"max_tokens": 5, "temperature": 0, "ignore_eos": True}})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["text_output"].startswith("Hi") and len(body["text_output"]) == 2 + 5
    assert body["finish_reason"] == "length"


def test_generate_stream_ends_with_the_finish_reason(http_url: str) -> None:
    answer = _generate(http_url, {"text_input": "Hi", "stream": True, "return_finish_reason": True,
                                  "sampling_parameters": json.dumps({"max_tokens": 6, "ignore_eos": True})},
                       stream=True)
    assert answer.status_code == 200, answer.text
    events = _events(answer)
    assert [event["finish_reason"] for event in events][-1] == "length"
    assert len("".join(event["text_output"] for event in events)) == 6


def test_logprobs_list_the_sampled_token_first_then_the_most_likely(http_url: str) -> None:
    answer = _generate(http_url, {"text_input": "Hi", "return_logprobs": True, "return_cumulative_logprob": True,
                                  "exclude_input_in_output": True,
                                  "sampling_parameters": json.dumps({"max_tokens": 4, "logprobs": 2, "seed": 7,
                                                                     "ignore_eos": True})})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    positions = json.loads(body["logprobs"])
    assert len(positions) == 4
    text = ""
    total = 0.0
    for position in positions:
        entries = list(position.values())
        assert 2 <= len(entries) <= 3  # the sampled token, then the 2 most likely (it may be one of them)
        assert [entry["rank"] for entry in entries[-2:]] == [1, 2]
        assert entries[-2]["logprob"] >= entries[-1]["logprob"]
        text += "" if entries[0]["decoded_token"] in SPECIAL_TOKENS else entries[0]["decoded_token"]
        total += entries[0]["logprob"]
    assert text == body["text_output"]  # the first entry of each is the token that was sampled
    assert body["cumulative_logprob"] == pytest.approx(total, abs=1e-3)


def test_n_2_gives_two_sequences(http_url: str) -> None:
    answer = _generate(http_url, {"text_input": "Hi", "exclude_input_in_output": True,
                                  "return_num_output_tokens": True,
                                  "sampling_parameters": json.dumps({"n": 2, "max_tokens": 8, "seed": 1,
                                                                     "ignore_eos": True})})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert len(body["text_output"]) == 2 and all(len(text) == 8 for text in body["text_output"])
    assert body["num_output_tokens"] == [8, 8]
    streamed = _generate(http_url, {"text_input": "Hi", "stream": True, "return_finish_reason": True,
                                    "sampling_parameters": json.dumps({"n": 2, "max_tokens": 5, "ignore_eos": True})},
                         stream=True)
    events = _events(streamed)
    assert all(len(event["text_output"]) == 2 for event in events)  # every response has both sequences
    assert [len("".join(event["text_output"][index] for event in events)) for index in (0, 1)] == [5, 5]
    assert events[-1]["finish_reason"].count("length") >= 1


@pytest.mark.parametrize(("parameters", "message"), [
    ({"temperature": -1}, "temperature must be non-negative, got -1"),
    ({"best_of": 2}, "Unexpected keyword argument 'best_of'"),
    ({"max_tokens": "many"}, "sampling parameter 'max_tokens' must be of type int, got 'many'"),
])
def test_bad_sampling_parameters_are_a_400_with_vllms_message(http_url: str, parameters: dict[str, Any],
                                                               message: str) -> None:
    answer = _generate(http_url, {"text_input": "Hi", "sampling_parameters": json.dumps(parameters)})
    assert answer.status_code == 400
    assert message in answer.json()["error"]


def test_bad_prompts_are_refused_with_vllms_message(
        grpc_stream: tuple[grpcclient.InferenceServerClient, queue.Queue[Any]], http_url: str) -> None:
    empty = _generate(http_url, {"text_input": ""})
    assert empty.status_code == 400 and "The decoder prompt cannot be empty" in empty.json()["error"]
    missing = _generate(http_url, {"sampling_parameters": "{}"})  # text_input is optional only for embeddings
    assert missing.status_code == 400 and missing.json()["error"] == "input 'text_input' is missing"
    client, results = grpc_stream
    client.async_stream_infer(MODEL, _inputs("x" * (MAX_MODEL_LEN + 10), stream=True))
    error = results.get(timeout=WAIT_S)
    assert isinstance(error, InferenceServerException)
    assert f"This model's maximum context length is {MAX_MODEL_LEN} tokens" in error.message()


def test_an_embedding_request_to_a_generative_model_is_refused(http_url: str) -> None:
    answer = _generate(http_url, {"text_input": "", "embedding_request": json.dumps({"input": "hello"})})
    assert answer.status_code == 400
    assert answer.json()["error"] == f"Model {MODEL} does not support 'embed' request"


def test_a_cancelled_stream_is_aborted_in_vllm_and_nothing_keeps_running(
        grpc_stream: tuple[grpcclient.InferenceServerClient, queue.Queue[Any]], server: RunningServer,
        engine: EngineClient) -> None:
    aborted_before = engine.aborted
    client, results = grpc_stream
    client.async_stream_infer(MODEL, _inputs("Hello", stream=True, sampling_parameters={
        "max_tokens": MAX_MODEL_LEN - 10, "ignore_eos": True}))
    first = results.get(timeout=WAIT_S)
    assert not isinstance(first, InferenceServerException), first
    client.stop_stream(cancel_requests=True)
    deadline = time.monotonic() + WAIT_S
    while engine.aborted == aborted_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.aborted == aborted_before + 1  # vLLM's final output said finish reason 'abort'
    assert engine.unfinished_after_abort == 0  # vLLM holds no unfinished request
    while time.monotonic() < deadline:  # and its scheduler says nothing runs
        if f'vllm:num_requests_running{{model="{MODEL}",version="1"}} 0' in httpx.get(server.metrics_url).text:
            break
        time.sleep(0.1)
    else:
        pytest.fail("vllm:num_requests_running did not return to 0")
    generated = _metric(server, "vllm:generation_tokens_total")
    time.sleep(0.5)
    assert _metric(server, "vllm:generation_tokens_total") == generated  # no sequence keeps generating


def _metric(server: RunningServer, name: str) -> float:
    for line in httpx.get(server.metrics_url).text.splitlines():
        if line.startswith(f'{name}{{model="{MODEL}",version="1"}} '):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not on /metrics")


def test_tritons_vllm_metrics_are_reported(server: RunningServer, http_url: str) -> None:
    tokens = _metric(server, "vllm:generation_tokens_total")
    answer = _generate(http_url, {"text_input": "Hi", "sampling_parameters": json.dumps(
        {"max_tokens": 3, "ignore_eos": True})})
    assert answer.status_code == 200, answer.text
    assert _metric(server, "vllm:generation_tokens_total") >= tokens + 3
    text = httpx.get(server.metrics_url).text
    labels = f'{{model="{MODEL}",version="1"}}'
    for counter in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        assert f"# TYPE {counter} counter" in text and f"{counter}{labels} " in text
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
                      "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens",
                      "vllm:request_generation_tokens", "vllm:request_params_n"):
        assert f"# TYPE {histogram} histogram" in text and f"{histogram}_count{labels} " in text
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert f"# TYPE {gauge} gauge" in text and f"{gauge}{labels} " in text
    assert f'vllm:time_to_first_token_seconds_bucket{{model="{MODEL}",version="1",le="0.001"}}' in text
    # vLLM's 1-2-5 buckets up to max_model_len (8192)
    assert f'vllm:request_prompt_tokens_bucket{{model="{MODEL}",version="1",le="5000"}}' in text
    assert f'vllm:request_prompt_tokens_bucket{{model="{MODEL}",version="1",le="10000"}}' not in text


def test_a_model_without_model_json_fails_to_load_naming_the_file(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match="'model.json' containing vllm engine args must be provided"):
        client.load_model("no_model_json")
