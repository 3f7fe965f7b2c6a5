"""The HTTP body codec: a JSON header parsed once serves every request that repeats it, each with its own
objects, and the response header it writes by hand reads as the JSON encoder would write it."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from triton_serve._engine.frontend.http import codec
from triton_serve._engine.frontend.http.codec import encode_response, parse_request
from triton_serve._engine.inference import InferenceResponse, Tensor
from triton_serve.plugin import ServerError

HEADER = json.dumps({
    "id": "r", "parameters": {"p": 1},
    "inputs": [{"name": "A", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": 8}},
               {"name": "S", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 7}}],
    "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}],
}).encode()


def _blobs(a: int, b: int, text: bytes) -> memoryview:
    return memoryview(struct.pack("<ii", a, b) + struct.pack("<I", len(text)) + text)


def test_a_repeated_header_gives_each_request_its_own_tensors_and_dicts() -> None:
    first = parse_request(HEADER, _blobs(1, 2, b"abc"), "m", None)
    second = parse_request(HEADER, _blobs(3, 4, b"xyz"), "m", 2)
    assert (HEADER,) in codec._PLANS  # no JSON data: kept whole
    assert first.inputs["A"].data.tolist() == [1, 2] and second.inputs["A"].data.tolist() == [3, 4]
    assert second.inputs["S"].data.tolist() == [b"xyz"] and second.model_version == 2
    assert (second.id, second.parameters, second.outputs[0].parameters) == ("r", {"p": 1}, {"binary_data": True})
    first.parameters["forwarded"] = "x"  # what header forwarding does to a request
    first.outputs[0].parameters["classification"] = 2
    third = parse_request(HEADER, _blobs(5, 6, b"abc"), "m", None)
    assert third.parameters == {"p": 1} and third.outputs[0].parameters == {"binary_data": True}


def test_the_blobs_of_a_repeated_header_are_checked_every_time() -> None:
    parse_request(HEADER, _blobs(1, 2, b"abc"), "m", None)
    with pytest.raises(ServerError, match="unexpected size for input 'S', expecting 2 additional bytes for model 'm'"):
        parse_request(HEADER, _blobs(1, 2, b"abc")[:-2], "m", None)
    with pytest.raises(ServerError, match="unexpected additional input data for model 'n'"):
        parse_request(HEADER, memoryview(bytes(_blobs(1, 2, b"abc")) + b"!"), "n", None)
    with pytest.raises(ServerError, match="'S'"):  # the BYTES element's length prefix says more than there is
        parse_request(HEADER, memoryview(struct.pack("<iiI", 1, 2, 9) + b"abc"), "m", None)


def _json_header(a: object, s: object, name: str = "A", separators: tuple[str, str] = (",", ":")) -> bytes:
    return json.dumps({"inputs": [{"name": name, "datatype": "INT32", "shape": [2], "data": a},
                                  {"name": "S", "datatype": "BYTES", "shape": [1], "data": s}],
                       "outputs": [{"name": "OUT"}]}, separators=separators).encode()


def _error(header: bytes) -> str:
    with pytest.raises(ServerError) as caught:
        parse_request(header, memoryview(b""), "m", None)
    return caught.value.message


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])  # perf_analyzer's JSON; Python's json.dumps
def test_a_header_with_json_data_is_kept_around_its_arrays(separators: tuple[str, str]) -> None:
    codec._PLANS.clear()
    for a, s in (([1, 2], ["x"]), ([3, -4], ["[y]"]), ([5, 6], ["a\"data\":[7]"])):
        request = parse_request(_json_header(a, s, separators=separators), memoryview(b""), "m", None)
        assert request.inputs["A"].data.tolist() == a and request.inputs["S"].data.tolist() == [s[0].encode()]
        assert [output.name for output in request.outputs] == ["OUT"]
    assert len(codec._PLANS) == 1  # one header: the strings with brackets were read in full, and not kept


def test_a_kept_header_answers_bad_data_as_a_header_read_in_full() -> None:
    bad = [_json_header([1, 2, 3], ["x"]), _json_header([1, "2"], ["x"]), _json_header([1, 2], [3]),
           _json_header([1, 2], ["x"]).replace(b"[1,2]", b"[1,2,]"), _json_header([1, 2], ["x"]).replace(b"2]", b"2 x]"),
           _json_header([1, 2], ["x"]).replace(b"[1,2]", b"\0"),
           # cut as the kept header is, but a string runs from one cut into the next
           _json_header([1, 2], ["x"]).replace(b"[1,2]", b'[1,"]').replace(b'["x"]', b'[",2]')]
    codec._PLANS.clear()
    unkept = [_error(header) for header in bad]
    assert not codec._PLANS
    parse_request(_json_header([7, 8], ["y"]), memoryview(b""), "m", None)
    assert len(codec._PLANS) == 1
    assert [_error(header) for header in bad] == unkept
    assert "failed to parse the request JSON buffer" in unkept[3] and "'A'" in unkept[0]

    def mixed(a: list[object]) -> bytes:  # a binary input before a JSON one
        return json.dumps({"inputs": [{"name": "B", "datatype": "INT32", "shape": [1],
                                       "parameters": {"binary_data_size": 4}},
                                      {"name": "A", "datatype": "INT32", "shape": [2], "data": a}]}).encode()
    unkept_mixed = _error(mixed([1]))  # and the blob is missing too
    parse_request(mixed([1, 2]), memoryview(b"\0" * 4), "m", None)
    assert _error(mixed([1])) == unkept_mixed and "'A'" in unkept_mixed


def test_a_header_is_kept_only_where_its_cuts_are_its_inputs_data() -> None:
    codec._PLANS.clear()
    nested = json.dumps({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1, 2], "data": [[1, 2]],
                                     'x"data': [9]}]}).encode()  # cut: the key's escaped quote ends in "data"
    in_an_output = json.dumps({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [1]}],
                               "outputs": [{"name": "O", "data": [2]}]}).encode()
    twice = b'{"inputs":[{"name":"A","datatype":"INT32","shape":[1],"data":[1],"data":[2]}]}'
    for header, expected in ((nested, [[1, 2]]), (in_an_output, [1]), (twice, [2])):
        for _ in range(2):
            assert parse_request(header, memoryview(b""), "m", None).inputs["A"].data.tolist() == expected
    assert not codec._PLANS


def test_kept_headers_are_bounded() -> None:
    codec._PLANS.clear()
    for n in range(codec._PLANS_MAX + 5):
        parse_request(json.dumps({"id": str(n), "inputs": []}).encode(), memoryview(b""), "m", None)
        assert 0 < len(codec._PLANS) <= codec._PLANS_MAX


def _as_the_encoder_writes_it(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def test_the_response_header_is_what_the_json_encoder_writes() -> None:
    request = parse_request(HEADER, _blobs(1, 2, b"abc"), "m", None)
    request.model_version, request.id = 3, 'q"\u00e9'
    binary = Tensor.from_wire("OUT", "INT32", (1, 2), struct.pack("<ii", 3, 4), {"binary_data": True})
    as_json = Tensor("J", "FP32", (2,), np.array([1.5, -2], dtype=np.float32))
    text = Tensor("T", "BYTES", (1,), np.array([b"h\xc3\xa9"], dtype=np.object_))
    in_region = Tensor("R", "INT8", (0, 4), np.zeros((0, 4), np.int8), {"shared_memory_region": "r"})
    response = InferenceResponse([binary, as_json, text, in_region], {"n": 1, "s": "\u00e9"})
    body, length = encode_response(response, request, "model \u00e9")
    assert length is not None and body[length:] == struct.pack("<ii", 3, 4)
    assert body[:length] == _as_the_encoder_writes_it({
        "model_name": "model \u00e9", "model_version": "3", "id": 'q"\u00e9', "parameters": {"n": 1, "s": "\u00e9"},
        "outputs": [
            {"name": "OUT", "datatype": "INT32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
            {"name": "J", "datatype": "FP32", "shape": [2], "data": [1.5, -2.0]},
            {"name": "T", "datatype": "BYTES", "shape": [1], "data": ["h\u00e9"]},
            {"name": "R", "datatype": "INT8", "shape": [0, 4]}]})
    request.id = ""
    body, length = encode_response(InferenceResponse([]), request, "m")
    assert length is None and body == _as_the_encoder_writes_it({"model_name": "m", "model_version": "3",
                                                                 "outputs": []})


def test_outputs_kept_in_wire_bytes_write_the_json_their_arrays_write() -> None:
    request = parse_request(HEADER, _blobs(1, 2, b"abc"), "m", None)
    arrays = {"BOOL": np.array([[True, False]]), "UINT8": np.array([[0, 255]], np.uint8),
              "UINT16": np.array([[0, 65535]], np.uint16), "UINT32": np.array([[0, 2**32 - 1]], np.uint32),
              "UINT64": np.array([[0, 2**64 - 1]], np.uint64), "INT8": np.array([[-128, 127]], np.int8),
              "INT16": np.array([[-(2**15), 7]], np.int16), "INT32": np.array([[-(2**31), 9]], np.int32),
              "INT64": np.array([[-(2**63), 2**63 - 1]], np.int64), "FP32": np.array([[0.1, -2.5]], np.float32),
              "FP64": np.array([[0.1, float("nan")]], np.float64), "BYTES": np.array([[b"a", b"\xc3\xa9"]], object)}
    from_arrays = [Tensor(name, name, (1, 2), array) for name, array in arrays.items()]
    # views into one received buffer at odd offsets, as a worker's answer arrives
    from_wire = [Tensor.from_wire(t.name, t.datatype, (1, 2), memoryview(b"x" + t.wire_bytes())[1:])
                 for t in from_arrays]
    assert encode_response(InferenceResponse(from_wire), request, "m") == \
        encode_response(InferenceResponse(from_arrays), request, "m")
    assert all(t._data is None for t in from_wire if t.datatype != "BYTES")  # numbers read from the bytes, no array


def test_integer_outputs_and_the_kept_heads_write_what_the_json_encoder_writes() -> None:
    request = parse_request(HEADER, _blobs(1, 2, b"abc"), "m", None)
    outputs = [Tensor("I", "INT64", (3,), np.array([-(2**63), 0, 2**63 - 1], dtype=np.int64)),
               Tensor("U", "UINT8", [1, 2], np.array([[0, 255]], dtype=np.uint8)),  # a shape given as a list
               Tensor("E", "INT32", (0,), np.zeros(0, np.int32)),
               Tensor("B", "BOOL", (2,), np.array([True, False]))]
    for version in (1, 2, 1):
        request.model_version = version
        body, length = encode_response(InferenceResponse(outputs), request, "m")
        assert length is None and body == _as_the_encoder_writes_it({
            "model_name": "m", "model_version": str(version), "id": "r", "outputs": [
                {"name": "I", "datatype": "INT64", "shape": [3], "data": [-(2**63), 0, 2**63 - 1]},
                {"name": "U", "datatype": "UINT8", "shape": [1, 2], "data": [0, 255]},
                {"name": "E", "datatype": "INT32", "shape": [0], "data": []},
                {"name": "B", "datatype": "BOOL", "shape": [2], "data": [True, False]}]})


# Every JSON value a client can put at each place of an /infer body; the parser answers each with a request or a
# ServerError (Triton's words, a status), never another exception (which the server logs as its own bug, 500).
ANY_JSON = [None, True, 0, -1, 2**70, 1.5, "", "x", "\ud800", [], [1], [[]], [1] * 65, {}, {"a": 1}]
BODY = {"id": "r", "parameters": {"p": 1, "sequence_id": 1, "priority": 1, "binary_data_output": True},
        "inputs": [{"name": "A", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]},
                   {"name": "S", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 7}}],
        "outputs": [{"name": "OUT", "parameters": {"binary_data": True, "classification": 1}}]}


def json_places(doc: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """The path of every value in ``doc``, containers included."""
    found = [path] if path else []
    children = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    for key, value in children:
        found += json_places(value, (*path, key))
    return found


def with_value(doc: object, path: tuple[object, ...], value: object) -> object:
    copy = json.loads(json.dumps(doc))
    parent = copy
    for key in path[:-1]:
        parent = parent[key]  # type: ignore[index]
    parent[path[-1]] = value  # type: ignore[index]
    return copy


def test_any_json_value_anywhere_in_a_body_is_a_request_or_a_server_error() -> None:
    from triton_serve._engine.route import apply_reserved_parameters
    blob = memoryview(struct.pack("<I", 3) + b"abc")
    answered = refused = 0
    for path in json_places(BODY):
        for value in ANY_JSON:
            header = json.dumps(with_value(BODY, path, value)).encode()
            try:
                request = parse_request(header, blob, "m", None)
                apply_reserved_parameters(request)
            except ServerError:
                refused += 1
                continue
            answered += 1
            assert all(type(v) in (str, bool, int, float) for v in request.parameters.values()), (path, value)
            assert all(type(o.parameters) is dict for o in request.outputs), (path, value)
    assert answered and refused  # both kinds of answer were exercised
