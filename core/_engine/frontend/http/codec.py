"""HTTP inference bodies: JSON tensors and the binary tensor data extension, both directions."""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from ...datatypes import BY_NAME, StringCountError, element_count, from_wire_bytes, name_of_config_type
from ...errors import ServerError, Status, internal
from ...inference import InferenceRequest, InferenceResponse, Parameters, RequestedOutput, Tensor
from ...protos.model_config_pb2 import ModelConfig
from ...shared_memory_parameters import BYTE_SIZE, OFFSET, REGION, no_data

# Made once: json.loads and json.dumps build a decoder or an encoder on every call.
_decode_json = json.JSONDecoder().decode
_encode_json = json.JSONEncoder(separators=(",", ":")).encode
_STRING, _BOOLEAN, _NUMBER = {str}, {bool}, {int, float}  # the Python types of valid JSON elements, by datatype
_ONE_OF = ("Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
           "'shared_memory_region' in 'parameters'. But")


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """Split a request body into its JSON header and binary part (Inference-Header-Content-Length)."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        length = int(header_length)
    except ValueError:
        raise ServerError(f"Inference-Header-Content-Length must be an integer, got: {header_length}") from None
    if length < 0 or length > len(body) or length > 2**31 - 1:
        raise ServerError(f"inference header size should be in range (0, {len(body)}), got: {length}")
    view = memoryview(body)
    return bytes(view[:length]), view[length:]


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    if not data or not isinstance(data[0], list):
        return data
    flat: list[Any] = []
    for item in data:
        flat.extend(_flatten(item))
    return flat


def _json_array(name: str, datatype: str, shape: tuple[int, ...], data: Any, model_name: str) -> np.ndarray:
    if datatype in ("FP16", "BF16"):
        raise ServerError(f"receiving {datatype} data via JSON is not supported. "
                          f"Please use the binary data format for input {name}")
    flat = _flatten(data)
    if datatype == "BYTES" and len(flat) != element_count(shape):
        raise ServerError(StringCountError(element_count(shape), len(flat)).message(name, model_name))
    if len(flat) != element_count(shape):
        raise ServerError(f"Unable to parse 'data' of input '{name}': shape {list(shape)} needs "
                          f"{element_count(shape)} elements, got {len(flat)}")
    kinds = set(map(type, flat))  # what JSON made of the elements: one C loop, not a Python check per element
    try:
        if datatype == "BYTES":
            if not kinds <= _STRING:
                raise ValueError("BYTES elements must be JSON strings")
            array = np.empty(len(flat), dtype=np.object_)
            array[:] = [x.encode("utf-8") for x in flat]
            return array.reshape(shape)
        if datatype == "BOOL":
            if not kinds <= _BOOLEAN:
                raise ValueError("BOOL elements must be true or false")
        elif not kinds <= _NUMBER:
            raise ValueError(f"{datatype} elements must be numbers")
        return np.array(flat, dtype=BY_NAME[datatype].numpy).reshape(shape)
    except (ValueError, TypeError, OverflowError) as error:
        raise ServerError(f"Unable to parse 'data' of input '{name}' as {datatype}: {error}") from None


def _parse_shape(name: str, raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list):
        raise ServerError(f"Unable to parse 'shape' of input '{name}': expected a list of integers")
    count, negative = 1, False
    for dim in raw:
        if type(dim) is not int:  # bool is a subclass of int: not a dim
            raise ServerError(f"Unable to parse 'shape' of input '{name}': expected a list of integers")
        negative = negative or dim < 0
        count *= dim
    if negative:
        raise ServerError(f"Unable to parse 'shape' of input '{name}': dims must be non-negative, got {raw}")
    if count > 2**40:
        raise ServerError(f"shape {raw} of input '{name}' causes total element count to exceed maximum size")
    return tuple(raw)


def parse_request(header: bytes, binary: memoryview, model_name: str, version: int | None) -> InferenceRequest:
    """Build an InferenceRequest from the JSON header and the binary blobs that follow it."""
    try:
        doc = _decode_json(header.decode("utf-8", "surrogatepass")) if header else {}  # as json.loads decodes
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ServerError(f"failed to parse the request JSON buffer: {error}") from None
    if not isinstance(doc, dict):
        raise ServerError("failed to parse the request JSON buffer: expected a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise ServerError("request JSON must contain an 'inputs' array")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise ServerError("request 'parameters' must be a JSON object")
    for key in params:
        if key.startswith("triton_"):
            raise ServerError(f"parameter keys starting with 'triton_' are reserved for Triton usage and "
                              f"should not be specified, got '{key}'")
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise ServerError("request 'id' must be a string")
    inputs: dict[str, Tensor] = {}
    offset = 0
    for raw in raw_inputs:
        tensor, used = _parse_input(raw, binary[offset:], model_name)
        if tensor.name in inputs:
            raise ServerError(f"input '{tensor.name}' is specified more than once for model '{model_name}'")
        inputs[tensor.name] = tensor
        offset += used
    if offset != len(binary):
        raise ServerError(f"unexpected additional input data for model '{model_name}'")
    outputs = []
    for raw in doc.get("outputs") or []:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ServerError("each requested output must be an object with a 'name'")
        out_params = dict(raw.get("parameters") or {})
        if REGION in out_params:
            if "classification" in out_params:
                raise ServerError("Output can't set both 'shared_memory_region' and 'classification'")
            if out_params.get("binary_data") is True:
                raise ServerError("Output can't set both 'shared_memory_region' and 'binary_data'")
            out_params.update(_shared_memory_parameters(out_params, raw["name"]))
        outputs.append(RequestedOutput(raw["name"], out_params))
    request = InferenceRequest(model_name, version, id=request_id, inputs=inputs, outputs=outputs,
                               parameters=params)
    return request


def _shared_memory_parameters(params: dict[str, Any], tensor: str) -> Parameters:
    """The region, offset and byte size a tensor's parameters name, with Triton's messages (and status)
    for values JSON cannot give as a string or an unsigned integer."""
    region = params[REGION]
    if not isinstance(region, str):
        raise ServerError(f"Unable to parse '{REGION}': attempt to access JSON non-string as string "
                          f"(tensor '{tensor}')", Status.INTERNAL)
    found: Parameters = {REGION: region}
    for key in (OFFSET, BYTE_SIZE):
        value = params.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
            raise ServerError(f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as "
                              f"unsigned-integer (tensor '{tensor}', shared memory region '{region}')",
                              Status.INTERNAL)
        found[key] = value
    return found


def _parse_input(raw: Any, binary: memoryview, model_name: str) -> tuple[Tensor, int]:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ServerError("each input must be an object with a string 'name'")
    name = raw["name"]
    datatype = raw.get("datatype")
    if datatype not in BY_NAME:
        raise ServerError(f"invalid datatype '{datatype}' for input '{name}'")
    shape = _parse_shape(name, raw.get("shape"))
    params = raw.get("parameters") or {}
    given = ("data" in raw) + ("binary_data_size" in params) + (REGION in params)
    if given != 1:
        raise ServerError(f"{_ONE_OF} {given} were set for input '{name}'")
    if REGION in params:  # the data plane reads it from the region
        return Tensor(name, datatype, shape, no_data(datatype), _shared_memory_parameters(params, name)), 0
    if "data" in raw:
        return Tensor(name, datatype, shape, _json_array(name, datatype, shape, raw["data"], model_name)), 0
    size = params["binary_data_size"]
    if not isinstance(size, int) or size < 0:
        raise ServerError(f"binary_data_size of input '{name}' must be a non-negative integer")
    if size > len(binary):
        raise ServerError(f"unexpected size for input '{name}', expecting {size - len(binary)} additional "
                          f"bytes for model '{model_name}'")
    dt = BY_NAME[datatype]
    if datatype != "BYTES" and size != element_count(shape) * dt.itemsize:
        raise ServerError(f"input byte size mismatch for input '{name}' for model '{model_name}'. "
                          f"Expected {element_count(shape) * dt.itemsize}, got {size}")
    try:
        return Tensor.from_wire(name, datatype, shape, binary[:size]), size
    except StringCountError as error:
        raise ServerError(error.message(name, model_name)) from None
    except ValueError as error:
        raise ServerError(f"invalid binary data for input '{name}' for model '{model_name}': {error}") from None


def parse_raw_binary(body: bytes, config: ModelConfig, model_name: str, version: int | None) -> InferenceRequest:
    """Inference-Header-Content-Length: 0: the body is the data of the model's only input, batch 1."""
    if len(config.input) != 1:
        raise ServerError(f"Raw request must only have 1 input (found 1) to be deduced "
                          f"but got {len(config.input)} inputs in '{model_name}' model configuration")
    spec = config.input[0]
    datatype = name_of_config_type(spec.data_type)
    dims = list(spec.dims)
    if datatype == "BYTES":
        if -1 in dims or element_count(dims) != 1:
            raise ServerError(f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]")
        shape: tuple[int, ...] = (1,)
        array = np.empty(1, dtype=np.object_)
        array[0] = bytes(body)
    else:
        if dims.count(-1) > 1:
            raise ServerError(f"The shape of the raw input '{spec.name}' can not be deduced because there are "
                              "more than one variable-sized dimension")
        itemsize = BY_NAME[datatype].itemsize
        known = element_count([d for d in dims if d != -1]) * itemsize
        if known == 0 or len(body) % known:
            raise ServerError(f"unexpected size {len(body)} for raw input '{spec.name}' of model '{model_name}'")
        shape = tuple(len(body) // known if d == -1 else d for d in dims)
        array = from_wire_bytes(datatype, shape, memoryview(body))
    if config.max_batch_size > 0:
        shape = (1, *shape)
        array = array.reshape(shape)
    request = InferenceRequest(model_name, version, inputs={spec.name: Tensor(spec.name, datatype, shape, array)},
                               parameters={"binary_data_output": True})
    return request


def encode_response(response: InferenceResponse, request: InferenceRequest,
                    model_name: str) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary blobs, the JSON header's length."""
    binary_default = request.parameters.get("binary_data_output", False) is True
    outputs_json: list[dict[str, Any]] = []
    blobs: list[bytes | bytearray | memoryview] = []
    for tensor in response.outputs:
        params = tensor.parameters
        binary = params.get("binary_data", binary_default) is True
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        outputs_json.append(entry)
        if REGION in params:  # written into shared memory: Triton sends only name, datatype and shape
            continue
        if binary:
            blob = tensor.wire_bytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_data(tensor)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": str(request.model_version)}
    if request.id:
        doc["id"] = request.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs_json
    header = _encode_json(doc).encode()
    if not any(blobs):
        return header, None
    return header + b"".join(blobs), len(header)


def _json_data(tensor: Tensor) -> list[Any]:
    if tensor.datatype in ("FP16", "BF16"):
        raise internal(f"sending {tensor.datatype} data via JSON is not supported. "
                       f"Please request binary data for output {tensor.name}")
    flat = tensor.data.ravel()
    if tensor.datatype == "BYTES":
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat]
    return flat.tolist()
