"""The generate extension's JSON: request keys to input tensors and parameters, responses to flat objects."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...datatypes import BY_NAME
from ... import request_json
from ...errors import ServerError, Status, internal, unsupported
from ...inference import InferenceRequest, InferenceResponse, Tensor
from .codec import request_parameter

# The key whose object holds more keys, mapped the same way (Triton's one nested schema).
NESTED_KEY = "parameters"
# What TritonJson says when a value is not of the kind a datatype reads.
_NOT_A = {
    "BOOL": "attempt to access JSON non-boolean as boolean",
    "signed": "attempt to access JSON non-signed-integer as signed-integer",
    "unsigned": "attempt to access JSON non-unsigned-integer as unsigned-integer",
    "float": "attempt to access JSON non-number as double",
}
_NOT_A_STRING = "attempt to access JSON non-string as string"


class _RepeatedKeys(dict[str, Any]):
    """A JSON object in which some key appears more than once: ``pairs`` keeps every one, in order, for
    the mapping to walk as Triton walks the object's members."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    return doc if len(doc) == len(pairs) else _RepeatedKeys(pairs)


_KEEPING_REPEATED_KEYS = request_json.decoder(object_pairs_hook=_object)


def parse_generate_body(body: bytes) -> Any:
    """A generate body's JSON ({} when empty), keeping every copy of a repeated key (see ``_KeyMapping``)."""
    if not body.strip():
        return {}
    return request_json.parse(body, using=_KEEPING_REPEATED_KEYS)


def generate_request(doc: Any, inputs: dict[str, dict[str, Any]], model_name: str, version: int | None,
                     max_input_size: int) -> InferenceRequest:
    """Build the request a generate body asks for. ``inputs`` is the model metadata's inputs by name
    (datatype, shape with -1 for variable dims): a key naming an input becomes that tensor, any other
    key a request parameter; the object under ``parameters`` is mapped the same way."""
    if not isinstance(doc, dict):
        raise internal("attempt to get members for non-object")
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise internal(f"Unable to parse 'id': {_NOT_A_STRING}")
    request = InferenceRequest(model_name, version, id=request_id)
    _KeyMapping(inputs, request, max_input_size).map(doc, nested=True)
    return request


class _KeyMapping:
    """Maps the keys of one generate body onto its request, counting the input bytes taken so far.

    An input given twice (a key repeated in one object, or given at the top level and under
    ``parameters``) is Triton's error ``input 'X' already exists in request``. Triton passes a parameter
    given twice to the model twice, which a request's parameters here cannot hold: that is an error too.
    """

    def __init__(self, inputs: dict[str, dict[str, Any]], request: InferenceRequest, max_input_size: int) -> None:
        self.inputs = inputs
        self.request = request
        self.max_input_size = max_input_size
        self.consumed = 0

    def map(self, doc: dict[str, Any], *, nested: bool) -> None:
        for key, value in doc.pairs if isinstance(doc, _RepeatedKeys) else doc.items():
            if nested and key == NESTED_KEY:
                self._map_nested(key, value)
            elif key in self.inputs:
                if key in self.request.inputs:
                    raise ServerError(f"input '{key}' already exists in request")
                tensor = _tensor(key, value, self.inputs[key])
                self._count(key, tensor)
                self.request.inputs[key] = tensor
            else:
                if key in self.request.parameters:
                    raise ServerError(f"parameter '{key}' is given more than once in the generate request")
                self.request.parameters[key] = request_parameter(key, value)

    def _map_nested(self, key: str, value: Any) -> None:
        if key in self.inputs:
            raise ServerError(f"Keyword '{key}' for nested schema also given as input tensor name")
        if not isinstance(value, dict):
            raise internal(f"Expected JSON object for keyword: '{key}': attempt to access JSON non-object as object")
        try:
            self.map(value, nested=False)
        except ServerError as error:
            raise ServerError(f"Converting keyword: '{key}': {error.message}", error.status) from None

    def _count(self, name: str, tensor: Tensor) -> None:
        if tensor.datatype == "BYTES":
            size = sum(len(element) + 4 for element in tensor.data.ravel())
        else:
            size = tensor.data.nbytes
        if self.consumed + size > self.max_input_size:
            raise ServerError(f"request size of {self.consumed} bytes with input '{name}' of size {size} bytes "
                              f"exceeds the maximum allowed input size of {self.max_input_size}. Use "
                              "--http-max-input-size to increase the limit.")
        self.consumed += size


def _tensor(name: str, value: Any, metadata: dict[str, Any]) -> Tensor:
    """One input from a scalar or a list (nested lists are flattened), shaped to the input's dims:
    the fixed dims take what they need, the innermost variable dim the rest, other variable dims 1."""
    datatype = metadata["datatype"]
    if datatype in ("FP16", "BF16"):
        raise ServerError(f"receiving {datatype} data via JSON is not supported. Please use the binary data "
                          f"format for input {name}")
    if datatype not in BY_NAME:
        raise ServerError(f"input '{name}' has unsupported datatype {datatype}")
    count = len(value) if isinstance(value, list) else 1
    elements = _flatten(value)
    if datatype == "BYTES":
        if not all(isinstance(element, str) for element in elements):
            raise internal(f"Unable to parse JSON bytes array: {_NOT_A_STRING}")
        count = len(elements)
    shape = _shape(name, count, list(metadata["shape"]))
    if count == 0:
        return Tensor(name, datatype, tuple(shape), np.empty(shape, BY_NAME[datatype].numpy))
    if len(elements) != count:
        raise internal("Unable to parse 'data': Shape does not match true shape of 'data' field")
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        try:
            array[:] = [element.encode("utf-8") for element in elements]
        except UnicodeEncodeError as error:  # a lone surrogate, which JSON's escapes can spell
            raise ServerError(f"Unable to parse JSON bytes array of input '{name}': {error}") from None
    else:
        _check_kind(datatype, elements)
        array = np.array(elements, dtype=BY_NAME[datatype].numpy)
    return Tensor(name, datatype, tuple(shape), array.reshape(shape))


def _shape(name: str, count: int, dims: list[int]) -> list[int]:
    remaining = count
    for dim in dims:
        if dim != -1:
            if dim == 0 or remaining % dim:
                raise ServerError(f"The schema can not convert input '{name}' to tensor with proper shape")
            remaining //= dim
    for index in range(len(dims) - 1, -1, -1):
        if dims[index] == -1:
            dims[index], remaining = remaining, 1
    if remaining != 1:  # no variable dim takes the count (none, or 0 elements for fixed dims)
        raise ServerError(f"The schema can not convert input '{name}' to tensor with proper shape")
    return dims


def _check_kind(datatype: str, elements: list[Any]) -> None:
    """Each element must be what TritonJson reads for ``datatype`` (a bool is no number here)."""
    if datatype == "BOOL":
        kind, ok = "BOOL", all(isinstance(e, bool) for e in elements)
    elif datatype.startswith("UINT"):
        kind = "unsigned"
        ok = all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < 2**64 for e in elements)
    elif datatype.startswith("INT"):
        kind = "signed"
        ok = all(isinstance(e, int) and not isinstance(e, bool) and -2**63 <= e < 2**63 for e in elements)
    else:
        kind, ok = "float", all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in elements)
    if not ok:
        raise internal(f"Unable to parse 'data': {_NOT_A[kind]}")


def _flatten(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return [value]
    flat: list[Any] = []
    for item in value:
        flat.extend(_flatten(item))
    return flat


def generate_response(response: InferenceResponse, request: InferenceRequest) -> dict[str, Any]:
    """One response as a flat object: ``id`` (when set), ``model_name``, ``model_version``, each response
    parameter and each output by name (one element as a scalar, else a flat list; BYTES as strings),
    keys in name order as Triton writes them."""
    fields: dict[str, Any] = {"model_name": request.model_name, "model_version": str(request.model_version)}
    if request.id:
        fields["id"] = request.id
    for key, value in response.parameters.items():
        fields[key] = _response_parameter(key, value)
    for tensor in response.outputs:
        fields[tensor.name] = _values(tensor)
    return dict(sorted(fields.items()))


def _response_parameter(key: str, value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        raise unsupported(f"Response parameter '{key}' has type 'TRITONSERVER_PARAMETER_BYTES' which is not "
                          "currently supported")
    return value


def _values(tensor: Tensor) -> Any:
    if tensor.datatype in ("FP16", "BF16"):
        raise ServerError(f"sending {tensor.datatype} data via JSON is not supported. Please request binary "
                          f"data for output {tensor.name}", Status.INTERNAL)
    flat = tensor.data.ravel()
    if tensor.datatype == "BYTES":
        values: list[Any] = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat]
    else:
        values = flat.tolist()
    return values[0] if len(values) == 1 else values
