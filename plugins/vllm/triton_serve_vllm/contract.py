"""Triton's vLLM backend tensor contract: the inputs and outputs auto-complete adds, and what a request asks (server
process; nothing here imports vLLM)."""
from __future__ import annotations

from typing import Any

from triton_serve.plugin import DataType, InferenceRequest, ModelConfig, ModelInput, ModelOutput, ServerError

from .protocol import Embed, Flags, Generate

# (name, data type, dims, optional) of each input, in Triton's order. Triton's backend makes ``text_input`` required,
# but Triton's server checks only how many inputs a request has, so an embedding request (``embedding_request``,
# no ``text_input``, as Triton's OpenAI front-end sends it) passes; this server checks required inputs by name, so
# ``text_input`` is optional here and a generate request without it is refused by ``read_request``.
INPUTS = (("text_input", DataType.TYPE_STRING, [1], True), ("image", DataType.TYPE_STRING, [-1], True),
          ("stream", DataType.TYPE_BOOL, [1], True), ("sampling_parameters", DataType.TYPE_STRING, [1], True),
          ("exclude_input_in_output", DataType.TYPE_BOOL, [1], True),
          ("return_finish_reason", DataType.TYPE_BOOL, [1], True),
          ("return_cumulative_logprob", DataType.TYPE_BOOL, [1], True),
          ("return_logprobs", DataType.TYPE_BOOL, [1], True),
          ("return_num_input_tokens", DataType.TYPE_BOOL, [1], True),
          ("return_num_output_tokens", DataType.TYPE_BOOL, [1], True),
          ("embedding_request", DataType.TYPE_STRING, [1], True))
OUTPUTS = (("text_output", DataType.TYPE_STRING, [-1]), ("finish_reason", DataType.TYPE_STRING, [-1]),
           ("cumulative_logprob", DataType.TYPE_FP32, [-1]), ("logprobs", DataType.TYPE_STRING, [-1]),
           ("num_input_tokens", DataType.TYPE_UINT32, [1]), ("num_output_tokens", DataType.TYPE_UINT32, [-1]))


def complete_config(config: ModelConfig) -> None:
    """Add the contract's inputs and outputs the config lacks; decoupled; no batching by Triton (vLLM batches)."""
    have = {spec.name for spec in config.input}
    for name, data_type, dims, optional in INPUTS:
        if name not in have:
            config.input.append(ModelInput(name=name, data_type=data_type, dims=dims, optional=optional))
    have = {spec.name for spec in config.output}
    for name, data_type, dims in OUTPUTS:
        if name not in have:
            config.output.append(ModelOutput(name=name, data_type=data_type, dims=dims))
    config.model_transaction_policy.decoupled = True
    config.max_batch_size = 0


def read_request(request: InferenceRequest, key: int) -> Generate | Embed:
    """The message that asks the engine for ``request`` (Triton's defaults; a bad input raises ServerError)."""
    embedding = request.inputs.get("embedding_request")
    if embedding is not None:
        return Embed(key, _text(embedding.data), Flags(num_input_tokens=_flag(request, "return_num_input_tokens"),
                                                       num_output_tokens=_flag(request, "return_num_output_tokens")))
    text = request.inputs.get("text_input")
    if text is None or text.data.size == 0:
        raise ServerError("input 'text_input' is missing")
    stream = _flag(request, "stream")
    exclude = request.inputs.get("exclude_input_in_output")
    # Triton's default: the prompt is put in front of the text unless streaming.
    prepend = not bool(exclude.data.ravel()[0]) if exclude is not None and exclude.data.size else not stream
    flags = Flags(stream=stream, prepend_input=prepend, finish_reason=_flag(request, "return_finish_reason"),
                  cumulative_logprob=_flag(request, "return_cumulative_logprob"),
                  logprobs=_flag(request, "return_logprobs"),
                  num_input_tokens=_flag(request, "return_num_input_tokens"),
                  num_output_tokens=_flag(request, "return_num_output_tokens"))
    sampling = request.inputs.get("sampling_parameters")
    parameters: str | dict[str, Any] = _text(sampling.data) if sampling is not None and sampling.data.size \
        else dict(request.parameters)
    images = request.inputs.get("image")
    return Generate(key, _text(text.data), parameters, flags,
                    tuple(_decoded(item) for item in images.data.ravel()) if images is not None else ())


def _flag(request: InferenceRequest, name: str) -> bool:
    tensor = request.inputs.get(name)
    return tensor is not None and tensor.data.size > 0 and bool(tensor.data.ravel()[0])


def _text(data: Any) -> str:
    return _decoded(data.ravel()[0])


def _decoded(item: Any) -> str:
    return item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)
