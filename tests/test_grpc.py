"""The gRPC front-end with tritonclient.grpc: health, metadata, repository, inference and bad input."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from triton_serve._engine.server import CORE_EXTENSIONS

from .conftest import ADD_SUB, FRONTEND_MODES, DATATYPES, every_datatype_config, REPEAT


@pytest.fixture(params=FRONTEND_MODES, ids=lambda count: f"frontend_processes={count}")
def frontend_processes(request: pytest.FixtureRequest) -> int:
    """Every test here runs with in-process front-ends and with two front-end processes."""
    return int(request.param)


FAILING = """
backend: "toy_error"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }
output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }
"""


@pytest.fixture
def server(add_model, toy_server):  # type: ignore[no-untyped-def]
    add_model("every_type", every_datatype_config())
    add_model("add_sub", ADD_SUB)
    add_model("repeat", REPEAT)
    add_model("failing", FAILING)
    return toy_server()


@pytest.fixture
def client(server) -> Iterator[grpcclient.InferenceServerClient]:  # type: ignore[no-untyped-def]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        yield client


@pytest.fixture
def stub(server) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _add_sub_inputs() -> tuple[list[grpcclient.InferInput], np.ndarray, np.ndarray]:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    inputs = [grpcclient.InferInput("INPUT0", [2, 16], "INT32"), grpcclient.InferInput("INPUT1", [2, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def _rpc_error(call, *args, **kwargs) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as raised:
        call(*args, **kwargs)
    return raised.value


# ---- health, metadata, config ----------------------------------------------------------------

def test_health_and_server_metadata(client) -> None:  # type: ignore[no-untyped-def]
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add_sub") and client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "2") and not client.is_model_ready("missing")
    metadata = client.get_server_metadata()
    assert metadata.name == "triton"
    assert list(metadata.extensions)[:len(CORE_EXTENSIONS)] == CORE_EXTENSIONS
    assert "schedule_policy" in metadata.extensions  # the batching plugin is installed


def test_model_metadata_and_config(client) -> None:  # type: ignore[no-untyped-def]
    metadata = client.get_model_metadata("add_sub", as_json=True)
    assert metadata == {"name": "add_sub", "versions": ["1"], "platform": "toy_add_sub",
                        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": ["-1", "16"]},
                                   {"name": "INPUT1", "datatype": "INT32", "shape": ["-1", "16"]}],
                        "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": ["-1", "16"]},
                                    {"name": "OUTPUT1", "datatype": "INT32", "shape": ["-1", "16"]}]}
    assert client.get_model_metadata("add_sub", "1", as_json=True) == metadata
    config = client.get_model_config("add_sub").config
    assert (config.name, config.backend, config.max_batch_size) == ("add_sub", "toy_add_sub", 8)
    assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    assert client.get_model_config("repeat").config.model_transaction_policy.decoupled


def test_unknown_model_and_version(client) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_metadata("missing")
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    assert raised.value.message() == "Request for unknown model: 'missing' is not found"
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_config("add_sub", "7")
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    assert raised.value.message() == "Request for unknown model: 'add_sub' version 7 is not found"
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_metadata("add_sub", "one")
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "version string 'one'" in raised.value.message()


# ---- model repository ------------------------------------------------------------------------

def test_repository_index_load_and_unload(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("every_type", every_datatype_config())
    server = toy_server(model_control_mode="explicit", load_models=["add_sub"])
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        index = client.get_model_repository_index(as_json=True)["models"]
        assert index == [{"name": "add_sub", "version": "1", "state": "READY"}, {"name": "every_type"}]
        client.load_model("every_type")
        assert client.is_model_ready("every_type")
        client.unload_model("add_sub")
        assert not client.is_model_ready("add_sub")
        ready = client.get_model_repository_index(as_json=True)["models"]
        assert [m["name"] for m in ready if m.get("state") == "READY"] == ["every_type"]
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("missing")
        assert raised.value.message() == "failed to load 'missing', failed to poll from model repository"


def test_load_needs_explicit_mode(client) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("add_sub")
    assert raised.value.status() == "StatusCode.UNAVAILABLE"
    assert raised.value.message() == "explicit model load / unload is not allowed if polling is enabled"


def test_unknown_repository_name_is_not_found(stub) -> None:  # type: ignore[no-untyped-def]
    error = _rpc_error(stub.RepositoryIndex, service_pb2.RepositoryIndexRequest(repository_name="other"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "model repository 'other' not found; the repositories are: 'models'"


# ---- inference -------------------------------------------------------------------------------

@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype(client, datatype: str) -> None:  # type: ignore[no-untyped-def]
    tensor = grpcclient.InferInput(f"INPUT_{datatype}", [3], datatype)
    tensor.set_data_from_numpy(DATATYPES[datatype])
    result = client.infer("every_type", [tensor])
    output = result.get_output(f"OUTPUT_{datatype}")
    assert (output.datatype, list(output.shape)) == (datatype, [3])
    assert result.as_numpy(f"OUTPUT_{datatype}").tolist() == DATATYPES[datatype].tolist()


def test_add_sub_with_id_version_and_requested_output(client) -> None:  # type: ignore[no-untyped-def]
    inputs, a, b = _add_sub_inputs()
    result = client.infer("add_sub", inputs)
    assert (result.as_numpy("OUTPUT0") == a + b).all() and (result.as_numpy("OUTPUT1") == a - b).all()
    result = client.infer("add_sub", inputs, model_version="1", request_id="req-7",
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("req-7", "add_sub", "1")
    assert [o.name for o in response.outputs] == ["OUTPUT1"] and len(response.raw_output_contents) == 1
    assert (result.as_numpy("OUTPUT1") == a - b).all()


def test_message_above_default_grpc_limit(client) -> None:  # type: ignore[no-untyped-def]
    data = np.random.default_rng(0).random(4 << 20, dtype=np.float32)  # 16 MB each way
    tensor = grpcclient.InferInput("INPUT_FP32", [data.size], "FP32")
    tensor.set_data_from_numpy(data)
    assert np.array_equal(client.infer("every_type", [tensor]).as_numpy("OUTPUT_FP32"), data)


def test_request_parameters(client, stub) -> None:  # type: ignore[no-untyped-def]
    inputs, a, b = _add_sub_inputs()
    result = client.infer("add_sub", inputs, parameters={"custom": "x", "count": 3, "flag": True}, priority=1)
    assert (result.as_numpy("OUTPUT0") == a + b).all()
    request = _request("every_type", [1])
    request.raw_input_contents.append(b"\0" * 4)
    request.parameters["triton_x"].int64_param = 1
    error = _rpc_error(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == ("parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                               "following keys starting with 'triton_' are allowed: "
                               "triton_enable_empty_final_response")
    del request.parameters["triton_x"]
    # the parameters the server reads itself take the proto fields Triton takes them from, with its words
    for key, field, value, details in [
        ("sequence_start", "string_param", "yes", "invalid value type for 'sequence_start' parameter, expected "
                                                  "bool_param."),
        ("sequence_end", "int64_param", 1, "invalid value type for 'sequence_end' parameter, expected bool_param."),
        ("sequence_id", "uint64_param", 7, "invalid value type for 'sequence_id' parameter, expected int64_param "
                                           "or string_param."),
        ("priority", "bool_param", True, "invalid value type for 'priority' parameter, expected int64_param or "
                                         "uint64_param."),
        ("priority", "int64_param", -1, "invalid value for 'priority', expected value >= 0."),
        ("timeout", "uint64_param", 5, "invalid value type for 'timeout' parameter, expected int64_param."),
    ]:
        setattr(request.parameters[key], field, value)
        error = _rpc_error(stub.ModelInfer, request)
        assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, details), key
        del request.parameters[key]
    request.parameters["sequence_id"].int64_param = -1  # read as 2**64 - 1, as Triton reads it; the timeout too
    request.parameters["timeout"].int64_param = -1
    assert stub.ModelInfer(request).model_name == "every_type"


def test_aio_client(server) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        async with aioclient.InferenceServerClient(server.grpc_url) as client:
            assert await client.is_server_live() and await client.is_server_ready()
            assert (await client.get_server_metadata()).name == "triton"
            assert (await client.get_model_config("add_sub")).config.max_batch_size == 8
            inputs, a, b = _add_sub_inputs()
            results = await asyncio.gather(*(client.infer("add_sub", inputs, request_id=str(i)) for i in range(8)))
            assert [r.get_response().id for r in results] == [str(i) for i in range(8)]
            assert all((r.as_numpy("OUTPUT1") == a - b).all() for r in results)
            with pytest.raises(InferenceServerException) as raised:
                await client.infer("missing", inputs)
            assert raised.value.status() == "StatusCode.NOT_FOUND"

    asyncio.run(run())


# ---- bad input -------------------------------------------------------------------------------

def _request(model: str, shape: list[int], datatype: str = "INT32", **tensor: object) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name=f"INPUT_{datatype}", datatype=datatype, shape=shape, **tensor)
    return request


@pytest.mark.parametrize(("datatype", "field", "values"), [
    ("BOOL", "bool_contents", [True, False, True]),
    ("INT8", "int_contents", [-128, 0, 127]),
    ("INT16", "int_contents", [-32768, 1, 32767]),
    ("INT32", "int_contents", [-2**31, 2, 2**31 - 1]),
    ("INT64", "int64_contents", [-2**63, 3, 2**63 - 1]),
    ("UINT8", "uint_contents", [0, 1, 255]),
    ("UINT16", "uint_contents", [0, 2, 65535]),
    ("UINT32", "uint_contents", [0, 3, 2**32 - 1]),
    ("UINT64", "uint64_contents", [0, 4, 2**64 - 1]),
    ("FP32", "fp32_contents", [-1.5, 0.25, 2.0]),
    ("FP64", "fp64_contents", [-1.5, 1e-300, 1.7e308]),
    ("BYTES", "bytes_contents", [b"hello", b"", "ünï".encode()]),
])
def test_typed_contents(stub, datatype: str, field: str, values: list[object]) -> None:  # type: ignore[no-untyped-def]
    request = _request("every_type", [3], datatype, contents={field: values})
    response = stub.ModelInfer(request)
    assert [o.name for o in response.outputs] == [f"OUTPUT_{datatype}"]
    result = grpcclient.InferResult(response)
    assert result.as_numpy(f"OUTPUT_{datatype}").tolist() == values


def test_mixed_contents_are_rejected(stub) -> None:  # type: ignore[no-untyped-def]
    request = _request("every_type", [1], contents={"int_contents": [1]})
    request.raw_input_contents.append(np.array([1], dtype=np.int32).tobytes())
    error = _rpc_error(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == ("contents field must not be specified when using raw_input_contents for "
                               "'INPUT_INT32' for model 'every_type'")


def test_contents_of_the_wrong_type_are_rejected(stub) -> None:  # type: ignore[no-untyped-def]
    error = _rpc_error(stub.ModelInfer, _request("every_type", [1], contents={"fp32_contents": [1.0]}))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == ("unexpected explicit tensor data for input tensor 'INPUT_INT32' for model "
                               "'every_type' of type 'FP32', expected datatype 'INT32'")


def test_more_dims_than_an_array_holds_are_rejected(stub) -> None:  # type: ignore[no-untyped-def]
    error = _rpc_error(stub.ModelInfer, _request("every_type", [1] * 65, contents={"int_contents": [1]}))
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "shape of input 'INPUT_INT32' for model 'every_type' has 65 dims; at most 64 are supported")


@pytest.mark.parametrize(("payload", "message"), [
    (b"\0" * 12, "input byte size mismatch for input 'INPUT_INT32' for model 'every_type'. Expected 16, got 12"),
    (None, "unable to find data for input tensor 'INPUT_INT32' for model 'every_type' in request."),
])
def test_wrong_or_missing_raw_data(stub, client, payload: bytes | None,  # type: ignore[no-untyped-def]
                                   message: str) -> None:
    request = _request("every_type", [4])
    if payload is not None:
        request.raw_input_contents.append(payload)
    error = _rpc_error(stub.ModelInfer, request)
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    assert client.is_server_ready()


def test_extra_raw_data_is_rejected(stub) -> None:  # type: ignore[no-untyped-def]
    request = _request("every_type", [1])
    request.raw_input_contents.extend([b"\0" * 4, b"\0" * 4])
    error = _rpc_error(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("unexpected additional input data for model 'every_type'")


def test_truncated_bytes_tensor(stub) -> None:  # type: ignore[no-untyped-def]
    request = _request("every_type", [1], "BYTES")
    request.raw_input_contents.append(b"\x05\0\0\0ab")
    error = _rpc_error(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == ("invalid BYTES data for input 'INPUT_BYTES' for model 'every_type': "
                               "BYTES element runs past the end of the tensor data")


def test_missing_input_and_wrong_shape(client) -> None:  # type: ignore[no-untyped-def]
    inputs, _, _ = _add_sub_inputs()
    with pytest.raises(InferenceServerException) as raised:
        client.infer("add_sub", inputs[:1])
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert raised.value.message().startswith("expected 2 inputs but got 1 inputs for model 'add_sub'")
    wrong = grpcclient.InferInput("INPUT1", [2, 8], "INT32")
    wrong.set_data_from_numpy(np.zeros((2, 8), dtype=np.int32))
    with pytest.raises(InferenceServerException) as raised:
        client.infer("add_sub", [inputs[0], wrong])
    assert raised.value.message() == ("unexpected shape for input 'INPUT1' for model 'add_sub'. "
                                      "Expected [-1, 16], got [2, 8]")


def test_unknown_model_decoupled_model_and_failing_model(client) -> None:  # type: ignore[no-untyped-def]
    tensor = grpcclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([2], dtype=np.int32))
    cases = [("missing", "StatusCode.NOT_FOUND", "Request for unknown model: 'missing' is not found"),
             ("repeat", "StatusCode.UNIMPLEMENTED",
              "ModelInfer RPC doesn't support models with decoupled transaction policy"),
             ("failing", "StatusCode.INTERNAL", "toy_error model 'failing' always fails")]
    for model, status, message in cases:
        with pytest.raises(InferenceServerException) as raised:
            client.infer(model, [tensor])
        assert (raised.value.status(), raised.value.message()) == (status, message)
    assert client.is_server_ready()


def test_response_parameters_take_the_proto_field_their_value_fits() -> None:
    from triton_serve._engine.errors import ServerError, Status
    from triton_serve._engine.frontend.grpc.codec import params_to_proto
    message = service_pb2.ModelInferResponse()
    params_to_proto({"low": -2**63, "high": 2**64 - 1, "one": 1, "flag": True}, message.parameters)
    assert [message.parameters[key].WhichOneof("parameter_choice") for key in ("low", "high", "one", "flag")] == \
        ["int64_param", "uint64_param", "int64_param", "bool_param"]
    for value in (2**64, -2**63 - 1):
        with pytest.raises(ServerError) as raised:
            params_to_proto({"n": value}, message.parameters)
        assert raised.value.status is Status.UNSUPPORTED
        assert raised.value.message == f"Response parameter 'n' is {value}, which fits neither int64_param nor uint64_param"
