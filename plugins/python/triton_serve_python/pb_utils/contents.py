"""pb_utils requests and responses as the core's content, the form they cross to the server in, and back."""
from __future__ import annotations

from typing import TYPE_CHECKING

from triton_serve.worker import RequestContent, RequestedOutput, ResponseContent, ServerError, Status
from triton_serve.worker import Tensor as CoreTensor

from .dtypes import BY_NAME
from .errors import CODE_NAMES, TritonError
from .tensor import Tensor

if TYPE_CHECKING:
    from .messages import InferenceRequest, InferenceResponse

_CODES = {name: code for code, name in CODE_NAMES.items()}


def core_tensor(tensor: Tensor) -> CoreTensor:
    array = tensor._array
    return CoreTensor(tensor._name, tensor._type.name, array.shape, array)


def response_content(response: InferenceResponse, content_type: type[ResponseContent]) -> ResponseContent:
    """``response`` (a model's) as content (the fields, not the accessors: fewer calls per response)."""
    error = response._error
    if error is not None:
        return content_type(error=ServerError(error.message(), Status[error.code_name()]))
    return content_type(tuple([core_tensor(tensor) for tensor in response._tensors]), response._parameters)


def pb_response(content: ResponseContent) -> InferenceResponse:
    """The pb_utils response ``content`` describes (a BLS call's)."""
    from .messages import InferenceResponse

    if content.error is not None:
        code = _CODES.get(content.error.status.name, TritonError.INTERNAL)
        return InferenceResponse(error=TritonError(content.error.message, code))
    outputs = [Tensor._typed(tensor.name, tensor.data, BY_NAME[tensor.datatype]) for tensor in content.outputs]
    return InferenceResponse(outputs, parameters=content.parameters)


def request_content(request: InferenceRequest, content_type: type[RequestContent]) -> RequestContent:
    """A BLS request as content (its scheduling fields travel beside it)."""
    version = request.model_version()
    return content_type(request.model_name(), version if version >= 0 else None, request.request_id(),
                        request._parameters, tuple(core_tensor(tensor) for tensor in request.inputs()),
                        tuple(RequestedOutput(name) for name in request.requested_output_names()))
