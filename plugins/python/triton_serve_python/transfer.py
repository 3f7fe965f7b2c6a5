"""Moves a batch across the process boundary: core requests in through the input arena, responses back out."""
from __future__ import annotations

from collections.abc import Sequence

from triton_serve.plugin import InferenceRequest, InferenceResponse, ServerError, Status, TensorLayout, tensor_from

from .protocol import RequestTuple, ResponseTuple

# Request parameters that the server turns into request fields, so a model never sees them as parameters.
_CONSUMED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                  "binary_data_output"})
_SEQUENCE_START, _SEQUENCE_END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END


def describe_requests(requests: Sequence[InferenceRequest], layout: TensorLayout) -> list[RequestTuple]:
    """One request tuple per request for the worker; input tensors are laid out in ``layout``."""
    described: list[RequestTuple] = []
    for request in requests:
        inputs = [layout.add_tensor(tensor) for tensor in request.inputs.values()]
        flags = (_SEQUENCE_START if request.sequence_start else 0) | (_SEQUENCE_END if request.sequence_end else 0)
        parameters = request.parameters
        if not _CONSUMED_PARAMETERS.isdisjoint(parameters):
            parameters = {k: v for k, v in parameters.items() if k not in _CONSUMED_PARAMETERS}
        described.append((request.id, request.sequence_id, flags, request.timeout_us,
                          [output.name for output in request.outputs], parameters, inputs))
    return described


def read_responses(results: list[ResponseTuple | None], output_buffer: memoryview | bytes,
                   copy: bool) -> list[InferenceResponse | None]:
    """Core responses from the worker's response tuples (None stays None: answered through a response sender);
    output bytes are views of ``output_buffer``, or with ``copy`` copies (out of an arena the worker reuses)."""
    responses: list[InferenceResponse | None] = []
    for result in results:
        if result is None:
            responses.append(None)
            continue
        if result[2] is not None:
            message, code_name = result[2]
            responses.append(InferenceResponse.from_error(ServerError(message, Status[code_name])))
            continue
        refs, parameters, _ = result
        outputs = [tensor_from(output_buffer, ref, copy=copy) for ref in refs]
        responses.append(InferenceResponse(outputs, parameters))
    return responses
