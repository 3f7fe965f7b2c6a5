"""How the engine process reads a request, without an engine: Triton's conversions of sampling parameters, LoRA
names, and the embedding contract."""
from __future__ import annotations

import json

import pytest
from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind

from triton_serve_vllm.embedding import pooling_request
from triton_serve_vllm.protocol import Flags, Generate, Outputs
from triton_serve_vllm.sampling import BadRequest, lora_request, request_parameters, sampling_params


def _params(parameters: str | dict[str, object], stream: bool = False) -> SamplingParams:
    return sampling_params(request_parameters(Generate(1, "Hi", parameters, Flags(stream=stream))), stream)


def test_values_are_converted_as_tritons_backend_converts_them() -> None:
    params = _params(json.dumps(
        {"temperature": "0.5", "max_tokens": 3.0, "ignore_eos": "true", "stop": ["x"], "seed": "7"}))
    assert (params.temperature, params.max_tokens, params.ignore_eos, params.stop, params.seed) == (0.5, 3, True,
                                                                                                      ["x"], 7)
    assert params.output_kind == RequestOutputKind.FINAL_ONLY
    streamed = _params("{}", stream=True)
    assert streamed.output_kind == RequestOutputKind.DELTA


def test_structured_outputs_come_as_json_text_or_object() -> None:
    params = _params(json.dumps({"structured_outputs": json.dumps({"json_object": True})}))
    assert params.structured_outputs is not None and params.structured_outputs.json_object is True
    params = _params(json.dumps({"structured_outputs": {"regex": "a+"}}))
    assert params.structured_outputs is not None and params.structured_outputs.regex == "a+"


def test_request_parameters_are_read_for_vllms_keys_only() -> None:
    parameters = request_parameters(Generate(1, "Hi", {"id": "r1", "max_tokens": 4, "lora_name": "a",
                                                       "triton_enable_empty_final_response": True}, Flags()))
    assert parameters == {"max_tokens": 4, "lora_name": "a"}


@pytest.mark.parametrize(("parameters", "message"), [
    ("{not json", "'sampling_parameters' is not valid JSON"),
    ("[1]", "'sampling_parameters' must be a JSON object"),
    ('{"ignore_eos": "maybe"}', "sampling parameter 'ignore_eos' must be a boolean, got 'maybe'"),
])
def test_unreadable_parameters_are_refused(parameters: str, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        _params(parameters)


def test_lora_names_pick_an_adapter_of_multi_lora_json() -> None:
    loras = {"doc": "/adapters/doc", "sql": "/adapters/sql"}
    lora = lora_request("sql", loras)
    assert lora is not None and (lora.lora_name, lora.lora_int_id, lora.lora_path) == ("sql", 2, "/adapters/sql")
    assert lora_request(None, loras) is None and lora_request(None, {}) is None
    with pytest.raises(BadRequest, match=r"LoRA x is not supported, we currently support \['doc', 'sql'\]"):
        lora_request("x", loras)
    with pytest.raises(BadRequest, match="LoRA feature is not enabled."):
        lora_request("x", {})


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


def test_cpu_lora_ops_leave_the_rows_without_an_adapter_alone() -> None:
    import torch
    from vllm.lora.ops.torch_ops import lora_ops

    from triton_serve_vllm.cpu_lora import skipping_rows_without_adapter

    shrink, expand = lora_ops.bgmv_shrink, lora_ops.bgmv_expand
    inputs, lora_a, lora_b = torch.randn(3, 8), torch.randn(2, 1, 4, 8), torch.randn(2, 1, 6, 4)  # two adapter slots
    indices, as_if_all_had_one = torch.tensor([0, -1, 1]), torch.tensor([0, 0, 1])
    reduced, expected = torch.zeros(3, 4), torch.zeros(3, 4)
    skipping_rows_without_adapter(shrink)(inputs, lora_a, reduced, indices, 0.5)
    shrink(inputs, lora_a, expected, as_if_all_had_one, 0.5)
    assert torch.equal(reduced[1], torch.zeros(4))  # vLLM's own op gives it the last slot's adapter
    assert torch.allclose(reduced[[0, 2]], expected[[0, 2]])
    output, expected = torch.ones(3, 6), torch.ones(3, 6)
    skipping_rows_without_adapter(expand)(reduced, lora_b, output, indices, add_inputs=True)
    expand(reduced, lora_b, expected, as_if_all_had_one, add_inputs=True)
    assert torch.equal(output[1], torch.ones(6)) and torch.allclose(output[[0, 2]], expected[[0, 2]])
