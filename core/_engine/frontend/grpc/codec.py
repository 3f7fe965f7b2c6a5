"""ModelInferRequest -> InferenceRequest, InferenceResponse -> ModelInferResponse, and parameter maps."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...datatypes import BY_NAME, MAX_DIMS, StringCountError, TensorType, element_count
from ...errors import ServerError, unsupported
from ...inference import (RESERVED_PARAMETERS, InferenceRequest, InferenceResponse, Parameters, RequestedOutput,
                          Tensor)
from ...protos.grpc_service_pb2 import InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse
from ...shared_memory_parameters import BYTE_SIZE, OFFSET, REGION, no_data

EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
FINAL_RESPONSE = "triton_final_response"
_INT64_MAX = 2**63 - 1

# Which typed ``contents`` field carries each datatype, and the datatype that field holds on its own
# (Triton narrows int_contents to INT8/INT16 and uint_contents to UINT8/UINT16). FP16 and BF16 have none.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
_FIELD_DATATYPE = {
    "bool_contents": "BOOL", "int_contents": "INT32", "int64_contents": "INT64", "uint_contents": "UINT32",
    "uint64_contents": "UINT64", "fp32_contents": "FP32", "fp64_contents": "FP64", "bytes_contents": "BYTES",
}


def parse_version(text: str) -> int | None:
    """gRPC carries versions as strings; "" means the latest ready version."""
    if not text:
        return None
    try:
        version = int(text)
    except ValueError:
        raise ServerError(f"failed to get model version from specified version string '{text}', "
                          "version should be an integral value > 0") from None
    if version < 0:
        raise ServerError(f"invalid model version specified '{text}' , version should be an integral value > 0")
    return version


def params_from_proto(params: Mapping[str, Any]) -> Parameters:
    """An InferParameter or ModelRepositoryParameter map as plain Python values."""
    values: Parameters = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        if choice is None:
            raise ServerError(f"parameter '{key}' has no value set")
        values[key] = getattr(param, choice)
    return values


def params_to_proto(values: Parameters, params: Any) -> None:
    """Write Python values into an InferParameter map: bool, int (uint64 above int64), str, float."""
    for key, value in values.items():
        param: InferParameter = params[key]
        if isinstance(value, (bool, np.bool_)):
            param.bool_param = bool(value)
        elif isinstance(value, (int, np.integer)):
            if not -_INT64_MAX - 1 <= value < 2**64:
                raise unsupported(f"Response parameter '{key}' is {value}, which fits neither int64_param nor "
                                  "uint64_param")
            if value > _INT64_MAX:
                param.uint64_param = int(value)
            else:
                param.int64_param = int(value)
        elif isinstance(value, str):
            param.string_param = value
        elif isinstance(value, (float, np.floating)):
            param.double_param = float(value)
        else:
            raise unsupported(f"Response parameter '{key}' of type '{type(value).__name__}' is not supported")


# The fields each request parameter the server reads itself may use, and how Triton's words name them.
_RESERVED_FIELDS = {
    "sequence_id": ({"int64_param", "string_param"}, "int64_param or string_param"),
    "sequence_start": ({"bool_param"}, "bool_param"),
    "sequence_end": ({"bool_param"}, "bool_param"),
    "priority": ({"int64_param", "uint64_param"}, "int64_param or uint64_param"),
    "timeout": ({"int64_param"}, "int64_param"),
}


def _request_parameters(params: Mapping[str, InferParameter]) -> Parameters:
    values = params_from_proto(params)
    for key in RESERVED_PARAMETERS.intersection(values):
        fields, expected = _RESERVED_FIELDS[key]
        field = params[key].WhichOneof("parameter_choice")
        if field not in fields:
            raise ServerError(f"invalid value type for '{key}' parameter, expected {expected}.")
        if field == "int64_param" and values[key] < 0:
            if key == "priority":
                raise ServerError("invalid value for 'priority', expected value >= 0.")
            values[key] += 2**64  # Triton reads a negative id or timeout as the unsigned integer of its bits
    for key in [k for k in values if k.startswith("triton_")]:
        if key != EMPTY_FINAL_RESPONSE:
            raise ServerError("parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                              f"following keys starting with 'triton_' are allowed: {EMPTY_FINAL_RESPONSE}")
        if not isinstance(values.pop(key), bool):
            raise ServerError(f"invalid value type for '{key}' parameter, expected bool_param.")
    return values


def wants_empty_final_response(message: ModelInferRequest) -> bool:
    """Whether a stream request asked for an empty final response from a decoupled model."""
    param = message.parameters.get(EMPTY_FINAL_RESPONSE)
    return param is not None and param.bool_param


def decode_request(message: ModelInferRequest) -> InferenceRequest:
    """Build an InferenceRequest; input data comes from ``raw_input_contents`` or typed ``contents``."""
    model = message.model_name
    raw = message.raw_input_contents
    raw_count = len(raw)
    inputs: dict[str, Tensor] = {}
    used = 0
    for tensor in message.inputs:
        name = tensor.name
        dt = BY_NAME.get(tensor.datatype)
        if dt is None:
            raise ServerError(f"invalid datatype '{tensor.datatype}' for input '{name}' of model '{model}'")
        shape = tuple(tensor.shape)
        if shape and min(shape) < 0:
            raise ServerError(f"shape {list(shape)} of input '{name}' for model '{model}' has negative dims")
        if len(shape) > MAX_DIMS:
            raise ServerError(f"shape of input '{name}' for model '{model}' has {len(shape)} dims; at most "
                              f"{MAX_DIMS} are supported")
        shared = _shared_memory_parameters(tensor) if tensor.parameters else None
        if shared is not None:  # the data plane reads it from the region
            if tensor.HasField("contents"):
                raise ServerError(f"unexpected 'content' provided when using shared memory for input tensor "
                                  f"'{name}' for model '{model}'")
            made = Tensor(name, dt.name, shape, no_data(dt.name), shared)
        elif tensor.HasField("contents"):
            if raw_count:
                raise ServerError(f"contents field must not be specified when using raw_input_contents for "
                                  f"'{name}' for model '{model}'")
            made = Tensor(name, dt.name, shape, _typed_array(model, name, dt, shape, tensor.contents))
        elif used < raw_count:
            made = _raw_tensor(model, name, dt, shape, raw[used])
            used += 1
        else:
            raise ServerError(f"unable to find data for input tensor '{name}' for model '{model}' in request.")
        if name in inputs:
            raise ServerError(f"input '{name}' is specified more than once for model '{model}'")
        inputs[name] = made
    if used != raw_count:
        raise ServerError(f"unexpected additional input data for model '{model}': {raw_count} "
                          f"raw_input_contents for {used} input(s) without typed contents")
    outputs = [_requested_output(o) for o in message.outputs]
    parameters = _request_parameters(message.parameters) if message.parameters else {}
    return InferenceRequest(model, parse_version(message.model_version), id=message.id, inputs=inputs,
                            outputs=outputs, parameters=parameters)


def _shared_memory_parameters(tensor: Any) -> Parameters | None:
    """The region, offset and byte size an input or requested output names, None if it names no
    region; Triton's checks and messages (``ParseSharedMemoryParams``)."""
    params = tensor.parameters
    found: Parameters = {}
    if REGION in params:
        if params[REGION].WhichOneof("parameter_choice") != "string_param":
            raise ServerError(f"invalid value type for '{REGION}' parameter for tensor '{tensor.name}', "
                              "expected string_param.")
        found[REGION] = params[REGION].string_param
    for key in (OFFSET, BYTE_SIZE):
        if key not in params:
            continue
        if not found:
            raise ServerError(f"'{key}' can not be specified without '{REGION}' parameter for tensor '{tensor.name}'")
        if params[key].WhichOneof("parameter_choice") != "int64_param":
            raise ServerError(f"invalid value type for '{key}' parameter for tensor '{tensor.name}', "
                              "expected int64_param.")
        found[key] = params[key].int64_param
    if found and BYTE_SIZE not in found:
        raise ServerError(f"'{BYTE_SIZE}' must be specified along with '{REGION}' parameter for tensor "
                          f"'{tensor.name}'")
    return found or None


def _requested_output(output: Any) -> RequestedOutput:
    if not output.parameters:
        return RequestedOutput(output.name, {})
    parameters = params_from_proto(output.parameters)
    if _shared_memory_parameters(output) is not None and "classification" in parameters:
        raise ServerError("output can't set both 'shared_memory_region' and 'classification'")
    return RequestedOutput(output.name, parameters)


def _raw_tensor(model: str, name: str, dt: TensorType, shape: tuple[int, ...], data: bytes) -> Tensor:
    """An input from its ``raw_input_contents`` entry, kept in wire form (BYTES are only counted)."""
    if dt.itemsize:
        expected = element_count(shape) * dt.itemsize
        if len(data) != expected:
            raise ServerError(f"input byte size mismatch for input '{name}' for model '{model}'. "
                              f"Expected {expected}, got {len(data)}")
    try:
        return Tensor.from_wire(name, dt.name, shape, data)
    except StringCountError as error:
        raise ServerError(error.message(name, model)) from None
    except ValueError as error:
        raise ServerError(f"invalid BYTES data for input '{name}' for model '{model}': {error}") from None


def _typed_array(model: str, name: str, dt: TensorType, shape: tuple[int, ...],
                 contents: InferTensorContents) -> np.ndarray:
    present = contents.ListFields()
    if len(present) > 1:
        raise ServerError(f"unexpected explicit tensor data for input tensor '{name}' for model '{model}', "
                          "binary data was already supplied.")
    if not present:
        array = np.empty(0, dtype=dt.numpy)
    else:
        field, values = present[0]
        if field.name != _CONTENTS_FIELD.get(dt.name):
            raise ServerError(f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' "
                              f"of type '{_FIELD_DATATYPE[field.name]}', expected datatype '{dt.name}'")
        if dt.name == "BYTES":
            array = np.empty(len(values), dtype=np.object_)
            array[:] = list(values)
        else:
            array = np.array(values, dtype=BY_NAME[_FIELD_DATATYPE[field.name]].numpy).astype(dt.numpy, copy=False)
    count = element_count(shape)
    if array.size != count:
        if dt.name == "BYTES":
            raise ServerError(StringCountError(count, array.size).message(name, model))
        raise ServerError(f"input byte size mismatch for input '{name}' for model '{model}'. "
                          f"Expected {count * dt.itemsize}, got {array.size * dt.itemsize}")
    return array.reshape(shape)


def encode_response(response: InferenceResponse, request: InferenceRequest, message: ModelInferResponse) -> None:
    """Fill ``message``: one ``raw_output_contents`` entry per output, in output order (tritonclient reads
    only those); the entry of an output written into shared memory is empty, as its data is."""
    message.model_name = request.model_name
    message.model_version = str(request.model_version)
    message.id = request.id
    outputs = message.outputs
    raw = message.raw_output_contents
    for tensor in response.outputs:
        outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        wire = tensor.wire_bytes()
        raw.append(wire if type(wire) is bytes else bytes(wire))
    if response.parameters:
        params_to_proto(response.parameters, message.parameters)
