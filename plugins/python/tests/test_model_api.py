"""triton_python_backend_utils without a server: tensors, types, BYTES, ModelConfig, errors, logger, seams."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import triton_python_backend_utils as pb_utils

from triton_serve.plugin import ServerError, parse_options
from triton_serve_python.options import PythonBackendOptions
from triton_serve_python.pb_utils.logger import set_log_sink


def test_tensor_types_follow_numpy() -> None:
    tensor = pb_utils.Tensor("x", np.zeros((2, 3), dtype=np.float32))
    assert (tensor.name(), tensor.triton_dtype(), tensor.shape(), tensor.is_cpu()) == ("x", 11, [2, 3], True)
    assert pb_utils.Tensor("s", np.array(["a", "b"])).triton_dtype() == 13
    assert pb_utils.Tensor("b", np.array([b"a"], dtype=object)).triton_dtype() == 13
    with pytest.raises(pb_utils.TritonModelException, match="complex128, which has no Triton datatype"):
        pb_utils.Tensor("c", np.zeros(2, dtype=np.complex128))
    with pytest.raises(pb_utils.TritonModelException, match="needs a numpy array, got list"):
        pb_utils.Tensor("l", [1, 2])  # type: ignore[arg-type]


def test_dlpack_round_trip_shares_memory() -> None:
    array = np.arange(6, dtype=np.int64)
    from_capsule = pb_utils.Tensor.from_dlpack("y", pb_utils.Tensor("x", array).to_dlpack())
    from_object = pb_utils.Tensor.from_dlpack("z", pb_utils.Tensor("x", array))
    array[0] = 42
    assert from_capsule.as_numpy()[0] == from_object.as_numpy()[0] == 42
    with pytest.raises(pb_utils.TritonModelException, match="BYTES, which DLPack cannot carry"):
        pb_utils.Tensor("s", np.array([b"a"], dtype=object)).to_dlpack()


def test_type_conversions() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_INT32") is np.int32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_to_numpy_type(12) is np.float64
    assert pb_utils.numpy_to_triton_type(np.float16) == 10
    assert pb_utils.numpy_to_triton_type(np.dtype(">i4")) == 8
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.complex64) is None


def test_bytes_serialization_round_trip() -> None:
    items = np.array([[b"ab", "\u00e9"], [b"", 7]], dtype=object)
    encoded = pb_utils.serialize_byte_tensor(items)
    assert encoded.item() == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9\x00\x00\x00\x00\x01\x00\x00\x007"
    assert pb_utils.deserialize_bytes_tensor(encoded.item()).tolist() == [b"ab", "\u00e9".encode(), b"", b"7"]
    with pytest.raises(pb_utils.TritonModelException, match="truncated"):
        pb_utils.deserialize_bytes_tensor(b"\x05\x00")
    with pytest.raises(pb_utils.TritonModelException, match="invalid datatype"):
        pb_utils.serialize_byte_tensor(np.zeros(2, dtype=np.int32))


def test_model_config_fills_what_is_missing() -> None:
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 0, "input": [], "output": []}))
    config.set_max_batch_size(8)
    config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]})
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": False})
    assert config.as_dict() == {
        "name": "m", "max_batch_size": 8, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}], "dynamic_batching": {},
        "model_transaction_policy": {"decoupled": False}}
    assert pb_utils.get_input_config_by_name(config.as_dict(), "X")["dims"] == [4]
    assert pb_utils.get_output_config_by_name(config.as_dict(), "nope") is None
    assert not pb_utils.using_decoupled_model_transaction_policy(config.as_dict())


@pytest.mark.parametrize(("call", "message"), [
    (lambda c: c.set_max_batch_size(4), "configuration specified max_batch_size 2, but auto_complete_config of "
                                        "model 'm' sets max_batch_size 4"),
    (lambda c: c.add_input({"name": "X", "data_type": "TYPE_INT8", "dims": [3]}),
     "its configuration gives input 'X' data_type TYPE_FP32, but auto_complete_config gives TYPE_INT8"),
    (lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]}),
     "its configuration gives input 'X' dims [3], but auto_complete_config gives [4]"),
    (lambda c: c.add_input({"name": "Z", "data_type": "TYPE_FP32", "dims": [1], "format": "NCHW"}),
     "input 'Z' has unknown properties ['format']"),
    (lambda c: c.add_output({"name": "Z", "dims": [1]}), "output 'Z' is missing data_type"),
    (lambda c: c.add_output({"name": "Z", "data_type": "FP32", "dims": [1]}), "has data_type 'FP32'; expected"),
    (lambda c: c.add_output({"name": "Z", "data_type": "TYPE_FP32", "dims": "1"}), "dims must be a list of ints"),
    (lambda c: c.set_model_transaction_policy({"decoupled": True}),
     "configuration of model 'm' specified decoupled False, but auto_complete_config sets decoupled True"),
])
def test_model_config_says_where_model_and_config_disagree(call, message) -> None:  # type: ignore[no-untyped-def]
    config = pb_utils.ModelConfig({"name": "m", "max_batch_size": 2, "model_transaction_policy": {"decoupled": False},
                                   "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [3]}]})
    with pytest.raises(ValueError) as raised:
        call(config)
    assert message in str(raised.value)


def test_response_parameters_are_checked() -> None:
    response = pb_utils.InferenceResponse([], parameters={"a": 1, "b": True, "c": "x"})
    assert json.loads(response.parameters()) == {"a": 1, "b": True, "c": "x"}
    for bad, kind in (({"f": 0.5}, "float"), ({"n": None}, "NoneType"), ({"d": {"x": 1}}, "dict")):
        with pytest.raises(pb_utils.TritonModelException, match=f"must be one of bool, int, str, got {kind}"):
            pb_utils.InferenceResponse([], parameters=bad)
    with pytest.raises(pb_utils.TritonModelException, match="error must be a pb_utils.TritonError or a str"):
        pb_utils.InferenceResponse(error=42)  # type: ignore[arg-type]
    error = pb_utils.InferenceResponse(error="oops").error()  # Triton takes a plain string
    assert error is not None and (error.message(), error.code()) == ("oops", pb_utils.TritonError.INTERNAL)


def test_triton_error_codes() -> None:
    error = pb_utils.TritonError("gone", pb_utils.TritonError.NOT_FOUND)
    assert (error.message(), error.code(), error.code_name(), str(error)) == ("gone", 2, "NOT_FOUND", "gone")
    assert pb_utils.TritonModelException("x").code() == pb_utils.TritonError.INTERNAL
    with pytest.raises(ValueError, match="TritonError code must be one of"):
        pb_utils.TritonError("x", 42)


def test_request_accessors() -> None:
    x = pb_utils.Tensor("X", np.zeros(2, np.int32))
    request = pb_utils.InferenceRequest(
        model_name="m", requested_output_names=["Y"], inputs=[x], request_id="r1", correlation_id=7,
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, timeout=100, parameters={"k": "v"})
    assert pb_utils.get_input_tensor_by_name(request, "X") is x
    assert pb_utils.get_input_tensor_by_name(request, "nope") is None
    assert (request.request_id(), request.correlation_id(), request.flags(), request.timeout()) == ("r1", 7, 1, 100)
    assert json.loads(request.parameters()) == {"k": "v"} and request.requested_output_names() == ["Y"]
    assert request.trace().get_context() is None and not request.is_cancelled()
    response = pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.ones(1))])
    assert pb_utils.get_output_tensor_by_name(response, "Y") is response.output_tensors()[0]


def test_later_features_raise_unsupported() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="not supported by triton-serve's python backend yet") \
            as raised:
        pb_utils.load_model("m")
    assert raised.value.code() == pb_utils.TritonError.UNSUPPORTED


@pytest.mark.parametrize("call", [lambda r: r.exec(), lambda r: next(r.exec(decoupled=True)),
                                  lambda r: asyncio.run(r.async_exec())])
def test_bls_outside_a_served_model_raises(call) -> None:  # type: ignore[no-untyped-def]
    request = pb_utils.InferenceRequest(model_name="m", requested_output_names=[], inputs=[])
    with pytest.raises(pb_utils.TritonModelException, match="works only inside a model that the python backend "
                                                            "serves") as raised:
        call(request)
    assert raised.value.code() == pb_utils.TritonError.UNSUPPORTED


def test_a_request_the_model_built_has_no_response_sender() -> None:
    request = pb_utils.InferenceRequest(model_name="m", requested_output_names=[], inputs=[])
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has no reference to the decoupled"):
        request.get_response_sender()
    assert not request.is_cancelled()


def test_logger_tags_lines_with_level_and_caller() -> None:
    lines: list[tuple[str, str]] = []
    previous = set_log_sink(lambda level, line: lines.append((level, line)))
    try:
        pb_utils.Logger.log_warn("careful")
        pb_utils.Logger.log("plain")
    finally:
        set_log_sink(previous)
    assert [level for level, _ in lines] == ["WARNING", "INFO"]
    assert lines[0][1].startswith("test_model_api.py:") and lines[0][1].endswith("] careful")


def parse(values: dict[str, str]) -> PythonBackendOptions:
    return parse_options(PythonBackendOptions, values, backend="python", source="--backend-config option")


def test_backend_options() -> None:
    options = parse({"execute-timeout-seconds": "2.5", "restart-on-failure": "off", "default-max-batch-size": "4"})
    assert options.execute_timeout_seconds == 2.5 and options.restart_on_failure is False
    with pytest.raises(ServerError, match="backend 'python': --backend-config option 'shm-default-byte-size' has "
                                          "invalid value 'big': expected an integer"):
        parse({"shm-default-byte-size": "big"})
    with pytest.raises(ServerError, match="'restart-on-failure' has invalid value 'maybe': expected true/false"):
        parse({"restart-on-failure": "maybe"})


@pytest.mark.parametrize(("key", "value", "message"), [  # Triton's python backend's words
    ("shm-growth-byte-size", "0", "shm-growth-byte-size can't be smaller than or equal to zero."),
    ("shm-default-byte-size", "4096", "shm-default-byte-size can't be smaller than 4 MiBs"),
    ("shm-region-prefix-name", "", "shm-region-prefix-name must at least contain one character."),
    ("stub-timeout-seconds", "0", "stub-timeout-seconds can't be smaller than or equal to zero."),
])
def test_backend_options_out_of_range(key: str, value: str, message: str) -> None:
    with pytest.raises(ServerError) as error:
        parse({key: value})
    assert error.value.message == (f"backend 'python': --backend-config option '{key}' has invalid value "
                                   f"'{value}': {message}")
