"""Business logic scripting: a model's ``InferenceRequest.exec()`` runs another model of the same server."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ..inline import pack_array, unpack_array
from ..protocol import CallFailed, InlineResponse
from .dtypes import BY_NAME
from .errors import CODE_NAMES, TritonError
from .server_link import server_link
from .tensor import Tensor

if TYPE_CHECKING:
    from .messages import InferenceRequest, InferenceResponse

_CODES = {name: code for code, name in CODE_NAMES.items()}
# The server's keys of the requests whose ``execute`` is running in this context (the runner sets them; tasks
# and ``asyncio.to_thread`` inherit them): a BLS request made there is cancelled when they all are.
calling_requests: ContextVar[tuple[int, ...]] = ContextVar("calling_requests", default=())


def pack_response(response: InferenceResponse) -> InlineResponse:
    """A pb_utils response as the frames carry it."""
    error = response.error()
    if error is not None:
        return None, None, (error.message(), error.code_name())
    tensors = [pack_array(tensor.name(), tensor.datatype, tensor.as_numpy()) for tensor in response.output_tensors()]
    return tensors, response._parameters, None


def unpack_response(packed: InlineResponse) -> InferenceResponse:
    """A pb_utils response from the frames' form."""
    from .messages import InferenceResponse

    tensors, parameters, error = packed
    if error is not None:
        return InferenceResponse(error=TritonError(error[0], _CODES.get(error[1], TritonError.INTERNAL)))
    outputs = [Tensor._typed(tensor[0], unpack_array(tensor), BY_NAME[tensor[1]]) for tensor in tensors or []]
    return InferenceResponse(outputs, parameters=parameters or {})


def pack_request(request: InferenceRequest) -> dict[str, Any]:
    """What the server's ``infer`` call needs to build the request."""
    return {
        "model_name": request.model_name(), "model_version": request.model_version(),
        "inputs": [pack_array(tensor.name(), tensor.datatype, tensor.as_numpy()) for tensor in request.inputs()],
        "outputs": request.requested_output_names(), "request_id": request.request_id(),
        "correlation_id": request.correlation_id(), "flags": request.flags(), "timeout": request.timeout(),
        "parameters": request._parameters, "parents": list(calling_requests.get()),
        "trace": request.trace()._request_key,
    }


def _failed(failure: CallFailed) -> InferenceResponse:
    from .messages import InferenceResponse

    return InferenceResponse(error=TritonError(failure.message, _CODES.get(failure.code_name, TritonError.INTERNAL)))


def execute(request: InferenceRequest) -> InferenceResponse:
    """Run ``request`` and return its one response; a failure comes back as a response with an error."""
    try:
        return unpack_response(server_link("InferenceRequest.exec").call_raw("infer", pack_request(request)))
    except CallFailed as failure:
        return _failed(failure)


def execute_streaming(request: InferenceRequest) -> Iterator[InferenceResponse]:
    """Run ``request`` on a decoupled model: its responses as they come, the last one possibly empty."""
    stream = server_link("InferenceRequest.exec").call_stream("infer_stream", pack_request(request))
    try:
        for packed in stream:
            yield unpack_response(packed)
    except CallFailed as failure:
        yield _failed(failure)


async def execute_async(request: InferenceRequest, decoupled: bool) -> Any:
    """``exec`` in a thread, so an ``async def execute`` can await several requests at once."""
    if decoupled:
        return await asyncio.to_thread(lambda: list(execute_streaming(request)))
    return await asyncio.to_thread(execute, request)
