"""HTTP inference bodies: JSON tensors and the binary tensor data extension, both directions."""
from __future__ import annotations

import json
import re
import secrets
import sys
from json.encoder import encode_basestring_ascii
from typing import Any, NamedTuple

import numpy as np

from ...datatypes import (BY_NAME, MAX_DIMS, StringCountError, element_count, from_wire_bytes,
                          name_of_config_type)
from ... import request_json
from ...errors import ServerError, Status, internal
from ...inference import (RESERVED_PARAMETERS, InferenceRequest, InferenceResponse, Parameters, RequestedOutput,
                          Tensor)
from ...protos.model_config_pb2 import ModelConfig
from ...shared_memory_parameters import BYTE_SIZE, OFFSET, REGION, no_data

# Made once: json.dumps builds an encoder on every call.
_encode_json = json.JSONEncoder(separators=(",", ":")).encode

_STRING, _BOOLEAN, _NUMBER = {str}, {bool}, {int, float}  # the Python types of valid JSON elements, by datatype
# The request parameters the server reads itself, each checked as Triton reads it (_reserved_parameter): any other
# must be a string, boolean or number.
_READ_BY_THE_SERVER = RESERVED_PARAMETERS | {"binary_data_output"}
_ONE_OF = ("Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
           "'shared_memory_region' in 'parameters'. But")


def _json_string(text: str) -> bytes:
    """``text`` as a JSON string, as ``_encode_json`` writes it (ASCII, escaped)."""
    return encode_basestring_ascii(text).encode()


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
    """An input's JSON ``data``, flattened as Triton reads nested arrays, as an array of ``shape``."""
    return _flat_json_array(name, datatype, shape, _flatten(data), model_name)


def _flat_json_array(name: str, datatype: str, shape: tuple[int, ...], flat: list[Any], model_name: str) -> np.ndarray:
    if datatype in ("FP16", "BF16"):
        raise ServerError(f"receiving {datatype} data via JSON is not supported. "
                          f"Please use the binary data format for input {name}")
    count = element_count(shape)
    if len(flat) != count:
        if datatype == "BYTES":
            raise ServerError(StringCountError(count, len(flat)).message(name, model_name))
        raise ServerError(f"Unable to parse 'data' of input '{name}': shape {list(shape)} needs "
                          f"{count} elements, got {len(flat)}")
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


def _parse_shape(name: str, raw: list[Any]) -> tuple[int, ...]:
    if len(raw) > MAX_DIMS:
        raise ServerError(f"shape of input '{name}' has {len(raw)} dims; at most {MAX_DIMS} are supported")
    count = 1
    for dim in raw:
        if type(dim) is not int or dim < 0:  # bool is a subclass of int: not a dim
            raise _unparsable("shape", "attempt to access JSON non-unsigned-integer as unsigned-integer")
        count *= dim
    if count > 2**40:
        raise ServerError(f"shape {raw} of input '{name}' causes total element count to exceed maximum size")
    return tuple(raw)


def _unparsable(key: str, why: str) -> ServerError:
    """What Triton answers when a field of a request's JSON is missing or of the wrong JSON type (status 500)."""
    return internal(f"Unable to parse '{key}': {why}")


def _member(raw: dict[str, Any], key: str, kind: type, kind_name: str) -> Any:
    """``raw[key]`` if it is a ``kind``, else Triton's words for what is not (a JSON value that is not an object
    is read as an empty one: Triton finds no member in it)."""
    if key not in raw:
        raise _unparsable(key, f"attempt to access non-existing object member '{key}'")
    value = raw[key]
    if not isinstance(value, kind):
        raise _unparsable(key, f"attempt to access JSON non-{kind_name} as {kind_name}")
    return value


class _InputPlan(NamedTuple):
    """One input as its JSON header describes it, checked: binary (``size`` bytes follow), in shared memory
    (``region``: its region, offset and byte size) or JSON (``array``; in a kept plan, ``cut`` instead: which
    of the header's cut-out arrays holds its data)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    size: int = 0
    region: Parameters | None = None
    array: np.ndarray | None = None
    cut: int = -1


class _HeaderPlan(NamedTuple):
    """A request's JSON header, checked: everything but the binary blobs that follow it."""

    id: str
    parameters: Parameters
    inputs: tuple[_InputPlan, ...]
    outputs: tuple[tuple[str, Parameters], ...]


# Checked headers by their text around the inputs' JSON ``data`` arrays (_cut_data): a client sends the same
# header for every request of one shape, only the numbers change, so the JSON around them is parsed once.
# Bounded in entries and in size; emptied when full.
_PLANS: dict[tuple[bytes, ...], _HeaderPlan] = {}
_PLANS_MAX, _PLAN_HEADER_MAX = 256, 4096
_DATA_ARRAY = re.compile(rb'("data"\s*:\s*)(\[[^\[\]]*\])')  # a member "data" holding a flat array
_NONCE = secrets.token_hex(8).encode()  # marks the cuts when a header's remains are checked: unknown to clients


def parse_request(header: bytes, binary: memoryview, model_name: str, version: int | None) -> InferenceRequest:
    """Build an InferenceRequest from the JSON header and the binary blobs that follow it."""
    remains, texts = _cut_data(header)
    plan = _PLANS.get(remains)
    data: list[np.ndarray] = []  # the arrays of a kept plan's JSON inputs, by cut
    if plan is None:
        plan = _plan_header(header, model_name)
        kept = _plan_to_keep(remains, plan)
        if kept is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[remains] = kept
    elif texts:
        try:
            decoded = request_json.decode_arrays(texts)  # flat: a cut holds no bracket
        except ValueError:  # JSONDecodeError, UnicodeDecodeError: one is not a JSON array
            plan = _plan_header(header, model_name)  # Triton's words for where the header's JSON breaks
        else:  # checked in the order of a header read in full: the data before any binary blob
            data = [_flat_json_array(spec.name, spec.datatype, spec.shape, decoded[spec.cut], model_name)
                    for spec in plan.inputs if spec.cut >= 0]
    inputs: dict[str, Tensor] = {}
    offset = 0
    for spec in plan.inputs:
        if spec.cut >= 0:
            inputs[spec.name] = Tensor(spec.name, spec.datatype, spec.shape, data[spec.cut])
        elif spec.array is not None:
            inputs[spec.name] = Tensor(spec.name, spec.datatype, spec.shape, spec.array)
        elif spec.region is not None:  # the data plane reads it from the region
            inputs[spec.name] = Tensor(spec.name, spec.datatype, spec.shape, no_data(spec.datatype), dict(spec.region))
        else:
            inputs[spec.name] = _binary_input(spec, binary[offset:], model_name)
            offset += spec.size
    if offset != len(binary):
        raise ServerError(f"unexpected additional input data for model '{model_name}'")
    return InferenceRequest(model_name, version, id=plan.id, inputs=inputs,
                            outputs=[RequestedOutput(name, dict(params)) for name, params in plan.outputs],
                            parameters=dict(plan.parameters))


def _cut_data(header: bytes) -> tuple[tuple[bytes, ...], list[bytes]]:
    """The header cut around each flat ``"data": [...]`` array: what remains (the text before the first
    ``"data":``, that ``"data":``, the text up to the next one, ..., the text after the last array) and the arrays'
    texts. A cut is not always an input's data (a member's name may end in ``data``): ``_plan_to_keep`` checks
    that before a plan is kept."""
    parts = _DATA_ARRAY.split(header)
    texts = parts[2::3]
    del parts[2::3]
    return tuple(parts), texts


def _plan_to_keep(remains: tuple[bytes, ...], plan: _HeaderPlan) -> _HeaderPlan | None:
    """The plan of a header just read, to keep for every header ``_cut_data`` cuts the same, whatever its arrays
    hold; None unless the cuts are, in order, the ``data`` of the plan's JSON inputs and nothing else: the
    header with a marker in each cut must read as a document whose inputs hold those markers as their data."""
    json_inputs = [index for index, spec in enumerate(plan.inputs) if spec.array is not None]
    if len(json_inputs) != len(remains) // 2 or sum(map(len, remains)) > _PLAN_HEADER_MAX:
        return None
    if not json_inputs:
        return plan
    markers = [b'"%s-%d"' % (_NONCE, index) for index in range(len(json_inputs))]
    text = b"".join(part + markers[index // 2] if index % 2 else part for index, part in enumerate(remains))
    try:
        doc = request_json.decode(text)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None
    raw_inputs = doc.get("inputs") if isinstance(doc, dict) else None
    found = [raw.get("data") for raw in raw_inputs if isinstance(raw, dict)] if isinstance(raw_inputs, list) else []
    if [value for value in found if value is not None] != [marker[1:-1].decode() for marker in markers]:
        return None
    inputs = list(plan.inputs)
    for index, position in enumerate(json_inputs):
        inputs[position] = inputs[position]._replace(array=None, cut=index)
    return plan._replace(inputs=tuple(inputs))


def _binary_input(spec: _InputPlan, binary: memoryview, model_name: str) -> Tensor:
    size = spec.size
    if size > len(binary):
        raise ServerError(f"unexpected size for input '{spec.name}', expecting {size - len(binary)} additional "
                          f"bytes for model '{model_name}'")
    try:
        return Tensor.from_wire(spec.name, spec.datatype, spec.shape, binary[:size])
    except StringCountError as error:
        raise ServerError(error.message(spec.name, model_name)) from None
    except ValueError as error:
        raise ServerError(f"invalid binary data for input '{spec.name}' for model '{model_name}': {error}") from None


def _plan_header(header: bytes, model_name: str) -> _HeaderPlan:
    """Read a request's JSON header in Triton's order (the id, the parameters, the inputs, the outputs), each
    field refused with Triton's words."""
    doc = request_json.parse(header)
    if not isinstance(doc, dict):
        doc = {}  # see _member
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise _unparsable("id", "attempt to access JSON non-string as string")
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise internal("failed to get request params.: attempt to get members for non-object")
    for key, value in params.items():
        if key.startswith("triton_"):
            raise ServerError(f"parameter keys starting with 'triton_' are reserved for Triton usage and "
                              f"should not be specified, got '{key}'")
        if key in _READ_BY_THE_SERVER:
            _reserved_parameter(key, value)
        else:
            request_parameter(key, value)
    raw_inputs = _member(doc, "inputs", list, "array")
    inputs: list[_InputPlan] = []
    names: set[str] = set()
    for raw in raw_inputs:
        spec = _plan_input(raw, model_name)
        if spec.name in names:
            raise ServerError(f"input '{spec.name}' is specified more than once for model '{model_name}'")
        names.add(spec.name)
        inputs.append(spec)
    raw_outputs = doc.get("outputs", [])
    if not isinstance(raw_outputs, list):
        raise _unparsable("outputs", "attempt to access JSON non-array as array")
    outputs = []
    for raw in raw_outputs:
        raw = raw if isinstance(raw, dict) else {}  # see _member
        out_params = dict(_tensor_parameters(raw))  # the plan's own (see below)
        if REGION in out_params:
            if "classification" in out_params:
                raise ServerError("Output can't set both 'shared_memory_region' and 'classification'")
            if out_params.get("binary_data") is True:
                raise ServerError("Output can't set both 'shared_memory_region' and 'binary_data'")
        name = _member(raw, "name", str, "string")
        if REGION in out_params:  # shared-memory values are added to the plan's own parameters
            out_params.update(_shared_memory_parameters(out_params, name))
        outputs.append((name, out_params))
    return _HeaderPlan(request_id, params, tuple(inputs), tuple(outputs))


def request_parameter(key: str, value: Any) -> Any:
    """``value`` if a request parameter may hold it (a string, boolean or number), else Triton's error."""
    if isinstance(value, (str, bool, int, float)):
        return value
    raise ServerError(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def _reserved_parameter(key: str, value: Any) -> None:
    """Check a request parameter the server reads itself as Triton reads it from JSON, with its words: the
    flags as booleans, the others as unsigned 64-bit integers (``sequence_id`` may be a string instead)."""
    if key in ("sequence_start", "sequence_end", "binary_data_output"):
        if not isinstance(value, bool):
            raise _unparsable(key, "attempt to access JSON non-boolean as boolean")
    elif type(value) is not int or not 0 <= value < 2**64:
        if key != "sequence_id":
            raise _unparsable(key, "attempt to access JSON non-unsigned-integer as unsigned-integer")
        if not isinstance(value, str):  # Triton tries a string when the id is not an unsigned integer
            raise _unparsable(key, "attempt to access JSON non-string as string")


def _tensor_parameters(raw: dict[str, Any]) -> Parameters:
    """An input's or requested output's ``parameters``; one that is not a JSON object is ignored, as Triton
    ignores it."""
    params = raw.get("parameters")
    return params if isinstance(params, dict) else {}


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


def _plan_input(raw: Any, model_name: str) -> _InputPlan:
    raw = raw if isinstance(raw, dict) else {}  # see _member
    params = _tensor_parameters(raw)
    has_data, has_binary, has_region = "data" in raw, "binary_data_size" in params, REGION in params
    if has_data + has_binary + has_region != 1:
        given = [field for field, present in (("'data'", has_data), ("'binary_data_size'", has_binary),
                                              ("'shared_memory_region'", has_region)) if present]
        raise ServerError(f"{_ONE_OF} {'set ' + ' '.join(given) if given else 'no field is set'}")
    name = _member(raw, "name", str, "string")
    datatype = _member(raw, "datatype", str, "string")
    shape = _parse_shape(name, _member(raw, "shape", list, "array"))
    if datatype not in BY_NAME:
        if has_data:  # Triton's words where it reads JSON data of a type it does not know
            raise ServerError(f"invalid datatype for input {name}")
        raise ServerError(f"invalid datatype '{datatype}' for input '{name}'")
    if REGION in params:
        return _InputPlan(name, datatype, shape, region=_shared_memory_parameters(params, name))
    if "data" in raw:
        return _InputPlan(name, datatype, shape, array=_json_array(name, datatype, shape, raw["data"], model_name))
    size = params["binary_data_size"]
    if not isinstance(size, int) or size < 0:
        raise ServerError(f"binary_data_size of input '{name}' must be a non-negative integer")
    if datatype != "BYTES" and size != element_count(shape) * BY_NAME[datatype].itemsize:
        raise ServerError(f"input byte size mismatch for input '{name}' for model '{model_name}'. "
                          f"Expected {element_count(shape) * BY_NAME[datatype].itemsize}, got {size}")
    return _InputPlan(name, datatype, shape, size=size)


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
        known = element_count([d for d in dims if d != -1]) * itemsize  # bytes of one step of the variable dim
        if -1 in dims and known == 0:
            raise ServerError(f"unexpected size {len(body)} for raw input '{spec.name}' of model '{model_name}'")
        shape = tuple(len(body) // known if d == -1 else d for d in dims)
        expected = element_count(shape) * itemsize
        if len(body) != expected:
            raise ServerError(f"input byte size mismatch for input '{spec.name}' for model '{model_name}'. "
                              f"Expected {expected}, got {len(body)}")
        array = from_wire_bytes(datatype, shape, memoryview(body))
    if config.max_batch_size > 0:
        shape = (1, *shape)
        array = array.reshape(shape)
    request = InferenceRequest(model_name, version, inputs={spec.name: Tensor(spec.name, datatype, shape, array)},
                               parameters={"binary_data_output": True})
    return request


# The bytes that open a response and each output's entry, by what they hold: a model answers with the same names,
# datatypes and shapes request after request. Bounded; emptied when full.
_HEADS: dict[tuple[Any, ...], bytes] = {}
_HEADS_MAX = 1024


def _keep_head(key: tuple[Any, ...], head: bytes) -> bytes:
    if len(_HEADS) >= _HEADS_MAX:
        _HEADS.clear()
    _HEADS[key] = head
    return head


def _response_head(model_name: str, version: Any) -> bytes:
    key = (model_name, version)
    return _HEADS.get(key) or _keep_head(key, b'{"model_name":%s,"model_version":%s' % (
        _json_string(model_name), _json_string(str(version))))


def _output_head(tensor: Tensor) -> bytes:
    key = (tensor.name, tensor.datatype, tuple(tensor.shape))
    return _HEADS.get(key) or _keep_head(key, b'{"name":%s,"datatype":%s,"shape":[%s]' % (
        _json_string(tensor.name), _json_string(tensor.datatype), ",".join(map(str, tensor.shape)).encode()))


def encode_response(response: InferenceResponse, request: InferenceRequest,
                    model_name: str) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary blobs, the JSON header's length. The header is written
    field by field (json.dumps of the whole document takes twice as long); values that are not names or
    numbers go through the JSON encoder."""
    binary_default = request.parameters.get("binary_data_output", False) is True
    header = [_response_head(model_name, request.model_version)]
    if request.id:
        header += (b',"id":', _json_string(request.id))
    if response.parameters:
        header += (b',"parameters":', _encode_json(response.parameters).encode())
    header.append(b',"outputs":[')
    blobs: list[bytes | bytearray | memoryview] = []
    for index, tensor in enumerate(response.outputs):
        params = tensor.parameters
        if index:
            header.append(b",")
        header.append(_output_head(tensor))
        if REGION in params:  # written into shared memory: Triton sends only name, datatype and shape
            header.append(b"}")
        elif params.get("binary_data", binary_default) is True:
            blob = tensor.wire_bytes()
            header.append(b',"parameters":{"binary_data_size":%d}}' % len(blob))
            blobs.append(blob)
        else:
            header += (b',"data":', _json_data(tensor), b"}")
    header.append(b"]}")
    head = b"".join(header)
    if not any(blobs):
        return head, None
    return head + b"".join(blobs), len(head)


# The datatypes whose wire bytes a memoryview reads as this machine's numbers (the wire's byte order is the host's),
# with their numpy dtypes, whose character code is the memoryview format of the same C type: a model's outputs
# still in wire bytes become JSON numbers with no array in between.
_READ_FROM_WIRE = {name: dt.numpy for name, dt in BY_NAME.items()
                   if dt.itemsize and name not in ("FP16", "BF16")} if sys.byteorder == "little" else {}


def _json_data(tensor: Tensor) -> bytes:
    """A tensor's elements as a flat JSON array."""
    datatype = tensor.datatype
    if datatype in ("FP16", "BF16"):
        raise internal(f"sending {datatype} data via JSON is not supported. "
                       f"Please request binary data for output {tensor.name}")
    wire, dtype = tensor.wire, _READ_FROM_WIRE.get(datatype)
    if wire is not None and dtype is not None:
        elements = memoryview(wire).cast("B").cast(dtype.char).tolist()  # type: ignore[arg-type]  # a str format
        integers = dtype.kind in "iu"
    else:
        flat = tensor.data.ravel()
        if datatype == "BYTES":
            return _encode_json([x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
                                 for x in flat]).encode()
        elements, integers = flat.tolist(), flat.dtype.kind in "iu"
    if integers:  # Python writes a list of integers as JSON does, but for the spaces
        return repr(elements).replace(", ", ",").encode()
    return _encode_json(elements).encode()
