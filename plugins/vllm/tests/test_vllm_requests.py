"""How the engine process reads a request, without an engine: Triton's conversions of sampling parameters, LoRA
names, and the embedding contract."""
from __future__ import annotations

import json

import pytest
from vllm.sampling_params import RequestOutputKind

from triton_serve_vllm.embedding import pooling_request
from triton_serve_vllm.protocol import Flags, Generate, Outputs
from triton_serve_vllm.sampling import BadRequest, sampling_params


def _generate(parameters: str | dict[str, object], stream: bool = False) -> Generate:
    return Generate(1, "Hi", parameters, Flags(stream=stream))


def test_values_are_converted_as_tritons_backend_converts_them() -> None:
    params, lora = sampling_params(_generate(json.dumps(
        {"temperature": "0.5", "max_tokens": 3.0, "ignore_eos": "true", "stop": ["x"], "seed": "7"})), {})
    assert (params.temperature, params.max_tokens, params.ignore_eos, params.stop, params.seed) == (0.5, 3, True,
                                                                                                      ["x"], 7)
    assert params.output_kind == RequestOutputKind.FINAL_ONLY and lora is None
    streamed, _ = sampling_params(_generate("{}", stream=True), {})
    assert streamed.output_kind == RequestOutputKind.DELTA


def test_structured_outputs_come_as_json_text_or_object() -> None:
    params, _ = sampling_params(_generate(json.dumps({"structured_outputs": json.dumps({"json_object": True})})), {})
    assert params.structured_outputs is not None and params.structured_outputs.json_object is True
    params, _ = sampling_params(_generate(json.dumps({"structured_outputs": {"regex": "a+"}})), {})
    assert params.structured_outputs is not None and params.structured_outputs.regex == "a+"


def test_request_parameters_are_read_for_vllms_keys_only() -> None:
    params, _ = sampling_params(_generate({"id": "r1", "max_tokens": 4, "triton_enable_empty_final_response": True}),
                                {})
    assert params.max_tokens == 4


@pytest.mark.parametrize(("parameters", "message"), [
    ("{not json", "'sampling_parameters' is not valid JSON"),
    ("[1]", "'sampling_parameters' must be a JSON object"),
    ('{"ignore_eos": "maybe"}', "sampling parameter 'ignore_eos' must be a boolean, got 'maybe'"),
])
def test_unreadable_parameters_are_refused(parameters: str, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        sampling_params(_generate(parameters), {})


def test_lora_names_pick_an_adapter_of_multi_lora_json() -> None:
    loras = {"doc": "/adapters/doc", "sql": "/adapters/sql"}
    _, lora = sampling_params(_generate('{"lora_name": "sql"}'), loras)
    assert lora is not None and (lora.lora_name, lora.lora_int_id, lora.lora_path) == ("sql", 2, "/adapters/sql")
    with pytest.raises(BadRequest, match=r"LoRA x is not supported, we currently support \['doc', 'sql'\]"):
        sampling_params(_generate('{"lora_name": "x"}'), loras)


def test_embedding_requests_take_a_text_or_token_ids_and_dimensions() -> None:
    prompt, params = pooling_request(json.dumps({"input": "hello", "pooling_params": {"dimensions": [8]}}))
    assert prompt == {"prompt": "hello"} and params.dimensions == 8
    prompt, params = pooling_request(json.dumps({"input": [1, 2, 3]}))
    assert prompt == {"prompt_token_ids": [1, 2, 3]} and params.dimensions is None
    with pytest.raises(BadRequest, match="must be a text or a list of token ids"):
        pooling_request(json.dumps({"input": {"a": 1}}))


def test_outputs_that_arrive_together_make_one_response() -> None:
    earlier = Outputs(["ab", ""], ["", ""], [-1.0, 0.0], ['[{"1": {"logprob": -1.0}}]', "[]"], [2, 0], 5)
    later = Outputs(["c", "x"], ["length", ""], [-2.0, -0.5], ['[{"2": {"logprob": -1.0}}]', '[{"3": {}}]'], [1, 1])
    merged = earlier.then(later)
    assert merged.text == ["abc", "x"] and merged.finish_reason == ["length", ""]
    assert merged.cumulative_logprob == [-2.0, -0.5] and merged.num_output_tokens == [3, 1]
    assert [json.loads(item) for item in merged.logprobs or []] == [
        [{"1": {"logprob": -1.0}}, {"2": {"logprob": -1.0}}], [{"3": {}}]]
    assert merged.num_input_tokens == 5
