"""Triton's LLM tensor contracts: which one a model follows, the inference request an OpenAI request becomes, and
what each response says."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triton_serve.frontend import (InferenceRequest, InferenceResponse, ModelConfig, ModelInput, Tensor,
                                 datatype_of_config)

from .errors import OpenAIError

VLLM = "vllm"  # text_input, stream, sampling_parameters (JSON), exclude_input_in_output, return_num_*_tokens
TRTLLM = "tensorrtllm"  # text_input, max_tokens, stop_words, stream, temperature, top_p, seed, ... as tensors

# TensorRT-LLM contract inputs filled from the OpenAI field of the same meaning.
_TRTLLM_SCALARS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "seed")


@dataclass
class Sampling:
    """The generation settings of one OpenAI request."""

    max_tokens: int
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    echo: bool = False
    response_format: dict[str, Any] | None = None  # {"type": "json_object"} or {"type": "json_schema", ...}
    logprobs: int | None = None  # how many top logprobs per token (vLLM's ``logprobs``); None: none asked for
    # vLLM's own sampling parameters: reach engines of the vLLM contract, refused by the others
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    best_of: int | None = None


# The Sampling fields only the vLLM contract carries (its sampling_parameters JSON has them).
VLLM_ONLY = ("min_tokens", "ignore_eos", "best_of")


@dataclass
class Piece:
    """What one response of the model says: new text and, where the model reports them, token counts and why it
    stopped."""

    text: str
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    # the vLLM backend's ``logprobs`` output: per new token, {token id: {"logprob", "rank", "decoded_token"}}
    logprobs: list[dict[str, dict[str, Any]]] | None = None


class Contract:
    """How to talk to one model: its contract (``VLLM`` or ``TRTLLM``) and input specs, read from its config.

    A model follows the vLLM contract when its backend is ``vllm`` or it takes a ``sampling_parameters`` input;
    any other model with a ``text_input`` input follows the TensorRT-LLM one (Triton's front-end uses that
    contract for every model that is not a vLLM one: TensorRT-LLM, ensembles, Python and BLS models)."""

    def __init__(self, name: str, config: ModelConfig) -> None:
        self.name = name
        self.config = config
        self.inputs: dict[str, ModelInput] = {spec.name: spec for spec in config.input}
        self.outputs = {spec.name for spec in config.output}
        if "text_input" not in self.inputs:
            raise OpenAIError(f"model '{name}' takes no 'text_input' input: it follows neither Triton's vLLM nor "
                              "its TensorRT-LLM tensor contract", 400, param="model")
        self.kind = VLLM if config.backend == "vllm" or "sampling_parameters" in self.inputs else TRTLLM

    @property
    def echoes(self) -> bool:
        """Whether the model can put the prompt in front of its output itself (``exclude_input_in_output``)."""
        return "exclude_input_in_output" in self.inputs

    def request(self, prompt: str, sampling: Sampling, request_id: str) -> InferenceRequest:
        """The inference request that asks the model to continue ``prompt``."""
        values: dict[str, list[Any]] = {"text_input": [prompt.encode()], "stream": [sampling.stream]}
        if sampling.logprobs is not None:
            self._check_logprobs()
            values["return_logprobs"] = [True]
        if self.kind == VLLM:
            values["sampling_parameters"] = [json.dumps(self._sampling_parameters(sampling)).encode()]
            values["exclude_input_in_output"] = [not sampling.echo]
            for flag in ("return_num_input_tokens", "return_num_output_tokens", "return_finish_reason"):
                values[flag] = [True]
        else:
            for name in VLLM_ONLY:
                if getattr(sampling, name) is not None:
                    raise OpenAIError(f"model '{self.name}' does not support '{name}': it follows the TensorRT-LLM "
                                      "tensor contract, which has no such input (vLLM's sampling parameters do)",
                                      400, param=name)
            values["max_tokens"] = [sampling.max_tokens]
            if sampling.stop:
                values["stop_words"] = [stop.encode() for stop in sampling.stop]
            for name in _TRTLLM_SCALARS:
                value = getattr(sampling, name)
                if value is not None:
                    values[name] = [value]
            if sampling.response_format is not None:
                guide_type, guide = _guide(sampling.response_format)
                if "guided_decoding_guide_type" not in self.inputs:
                    raise OpenAIError(f"model '{self.name}' does not support constrained decoding "
                                      "('response_format'): it has no 'guided_decoding_guide_type' input",
                                      400, param="response_format")
                values["guided_decoding_guide_type"] = [guide_type.encode()]
                if guide is not None:
                    values["guided_decoding_guide"] = [guide.encode()]
        inputs = {name: self._tensor(self.inputs[name], items) for name, items in values.items()
                  if name in self.inputs}
        return InferenceRequest(self.name, inputs=inputs, id=request_id)

    def _sampling_parameters(self, sampling: Sampling) -> dict[str, Any]:
        parameters: dict[str, Any] = {"max_tokens": sampling.max_tokens}
        for name in _TRTLLM_SCALARS:
            value = getattr(sampling, name)
            if value is not None:
                parameters[name] = value
        if sampling.stop:
            parameters["stop"] = sampling.stop
        if sampling.logprobs is not None:
            parameters["logprobs"] = sampling.logprobs
        for name in VLLM_ONLY:
            if getattr(sampling, name) is not None:
                parameters[name] = getattr(sampling, name)
        if sampling.response_format is not None:  # vLLM's StructuredOutputsParams, as a JSON string
            guide_type, guide = _guide(sampling.response_format)
            guided = {"json_object": True} if guide is None else {"json": json.loads(guide)}
            parameters["structured_outputs"] = json.dumps(guided)
        return parameters

    def _check_logprobs(self) -> None:
        """Logprobs follow the vLLM backend's contract: a ``return_logprobs`` input and a ``logprobs`` output."""
        if self.kind != VLLM or "return_logprobs" not in self.inputs or "logprobs" not in self.outputs:
            raise OpenAIError(f"model '{self.name}' cannot return logprobs: it has no 'return_logprobs' input and "
                              "'logprobs' output (the vLLM backend's contract)", 400, param="logprobs")

    def _tensor(self, spec: ModelInput, items: list[Any]) -> Tensor:
        return input_tensor(self.config, spec, items)

    @staticmethod
    def piece(response: InferenceResponse) -> Piece:
        """The text, finish reason and token counts in one of the model's responses."""
        piece = Piece(_string(response, "text_output") or "")
        reason = _string(response, "finish_reason")
        if reason:
            piece.finish_reason = "length" if reason == "length" else "stop"
        piece.input_tokens = _count(response, "num_input_tokens")
        piece.output_tokens = _count(response, "num_output_tokens")
        logprobs = _string(response, "logprobs")
        if logprobs and logprobs != "null":
            try:
                decoded = json.loads(logprobs)
            except ValueError:
                decoded = None
            if isinstance(decoded, list):
                piece.logprobs = [entry for entry in decoded if isinstance(entry, dict) and entry]
        return piece


def input_tensor(config: ModelConfig, spec: ModelInput, items: list[Any]) -> Tensor:
    """``items`` as the input ``spec`` of a model with ``config`` takes them (a batching model gets a batch
    dimension of 1)."""
    tensor_type = datatype_of_config(spec.data_type)
    if tensor_type.name == "BYTES":
        data = np.array([item if isinstance(item, bytes) else str(item).encode() for item in items],
                        dtype=np.object_)
    else:
        data = np.array(items, dtype=tensor_type.numpy)
    dims = list(spec.dims) or [1]
    shape = [1] * (len(dims) - 1) + [len(items)]
    if config.max_batch_size > 0:
        shape.insert(0, 1)
    return Tensor(spec.name, tensor_type.name, tuple(shape), data.reshape(shape))


def output_string(response: InferenceResponse, name: str) -> str | None:
    """The first element of a BYTES output, as text (None when the response has no such output)."""
    return _string(response, name)


def output_count(response: InferenceResponse, name: str) -> int | None:
    """The first element of an integer output (None when the response has no such output)."""
    return _count(response, name)


def _guide(response_format: dict[str, Any]) -> tuple[str, str | None]:
    """The guide type and guide (a JSON schema, or None) a ``response_format`` asks for."""
    if response_format["type"] == "json_object":
        return "json", None
    schema = response_format["json_schema"].get("schema", {})
    return "json_schema", json.dumps(schema)


def _string(response: InferenceResponse, name: str) -> str | None:
    tensor = response.output(name)
    if tensor is None or tensor.data.size == 0:
        return None
    item = tensor.data.ravel()[0]
    return item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)


def _count(response: InferenceResponse, name: str) -> int | None:
    tensor = response.output(name)
    if tensor is None or tensor.data.size == 0:
        return None
    return int(tensor.data.ravel()[0])
