"""Moves a batch across the process boundary: requests' content in through the input arena, responses' back out."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from triton_serve.plugin import ContentMeta, InferenceRequest, InferenceResponse, TensorLayout, decode_content, encode_content

from .protocol import RequestTuple

# Request parameters that the server turns into request fields, so a model never sees them as parameters.
_CONSUMED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                  "binary_data_output"})
_SEQUENCE_START, _SEQUENCE_END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END


def describe_requests(requests: Sequence[InferenceRequest], layout: TensorLayout) -> list[RequestTuple]:
    """One request tuple per request for the worker: its content (wire.py's codec, input tensors laid out in
    ``layout``) and the sequence fields and timeout that Triton gives a Python model too."""
    described: list[RequestTuple] = []
    for request in requests:
        content = request.content
        if not _CONSUMED_PARAMETERS.isdisjoint(content.parameters):
            content = replace(content, parameters={k: v for k, v in content.parameters.items()
                                                   if k not in _CONSUMED_PARAMETERS})
        flags = (_SEQUENCE_START if request.sequence_start else 0) | (_SEQUENCE_END if request.sequence_end else 0)
        described.append((encode_content(content, layout), request.sequence_id, flags, request.timeout_us))
    return described


def read_responses(results: list[ContentMeta | None], output_buffer: memoryview | bytes,
                   copy: bool) -> list[InferenceResponse | None]:
    """Core responses from the worker's response contents (None stays None: answered through a response sender);
    output bytes are views of ``output_buffer``, or with ``copy`` copies (out of an arena the worker reuses)."""
    content_type = InferenceResponse.content_type
    return [None if result is None else InferenceResponse.from_content(
        decode_content(content_type, result, output_buffer, copy)) for result in results]
