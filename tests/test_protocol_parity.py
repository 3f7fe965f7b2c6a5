"""Protocol details Triton clients notice, with Triton 2.51's words, through both clients."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .conftest import ADD_SUB

STRINGS = """
backend: "toy_identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
ONE_INPUT = """
backend: "toy_identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""

# What server metadata lists with the plugins this repository installs (Triton 2.51's names).
EXTENSIONS = {"classification", "sequence", "model_repository", "model_repository(unload_dependents)",
              "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
              "binary_tensor_data", "parameters", "statistics", "trace", "logging"}


def _client(protocol: str, server):  # type: ignore[no-untyped-def]
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("elements", "message"), [
    (3, "unexpected number of string elements 3 for inference input 'INPUT0' for model 'strings', expecting 2"),
    (1, "expected 2 string elements for inference input 'INPUT0' for model 'strings', got 1"),
])
def test_bytes_data_with_a_different_element_count_than_its_shape(protocol: str, elements: int, message: str,
                                                                   add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("strings", STRINGS)
    module, client = _client(protocol, toy_server())
    tensor = module.InferInput("INPUT0", [1, elements], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"x"] * elements], dtype=np.object_))
    tensor.set_shape([1, 2])  # the shape now disagrees with the data the client serialized
    with pytest.raises(InferenceServerException) as error:
        client.infer("strings", [tensor])
    assert error.value.message().endswith(message)
    assert error.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_json_bytes_data_with_more_elements_than_its_shape(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("strings", STRINGS)
    server = toy_server()
    response = httpx.post(f"http://{server.http_url}/v2/models/strings/infer", json={"inputs": [
        {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "data": ["a", "b"]}]})
    assert response.status_code == 400
    assert response.json()["error"] == ("unexpected number of string elements 2 for inference input 'INPUT0' for "
                                        "model 'strings', expecting 1")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_missing_inputs_count_the_optional_ones(protocol: str, add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("optional", 'backend: "toy_identity"\nmax_batch_size: 0\n'
              'input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }\n'
              'input { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1 ] }\n'
              'input { name: "INPUT2" data_type: TYPE_INT32 dims: [ 1 ] optional: true }\n'
              'output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }')
    add_model("add_sub", ADD_SUB)
    module, client = _client(protocol, toy_server())
    tensor = module.InferInput("INPUT2", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException) as error:
        client.infer("optional", [tensor])
    assert error.value.message() == (
        "expected number of inputs between 2 and 3 but got 1 inputs for model 'optional'. Got input(s) ['INPUT2'], "
        "but missing required input(s) ['INPUT0','INPUT1']. Please provide all required input(s).")
    with pytest.raises(InferenceServerException) as error:
        client.infer("add_sub", [])
    assert error.value.message() == (
        "expected 2 inputs but got 0 inputs for model 'add_sub'. Got input(s) [], but missing required input(s) "
        "['INPUT0','INPUT1']. Please provide all required input(s).")
    assert error.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_raw_binary_request_for_a_model_with_two_inputs(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    server = toy_server()
    response = httpx.post(f"http://{server.http_url}/v2/models/add_sub/infer", content=bytes(64),
                          headers={"Inference-Header-Content-Length": "0"})
    assert response.status_code == 400
    assert response.json()["error"] == ("Raw request must only have 1 input (found 1) to be deduced but got 2 "
                                        "inputs in 'add_sub' model configuration")


def test_raw_binary_bytes_input_needs_shape_one(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("strings", STRINGS)
    server = toy_server()
    response = httpx.post(f"http://{server.http_url}/v2/models/strings/infer", content=b"hello",
                          headers={"Inference-Header-Content-Length": "0"})
    assert response.status_code == 400
    assert response.json()["error"] == ("For BYTE datatype raw input 'INPUT0', the model must have input shape [1]")


@pytest.mark.parametrize(("size", "answer"), [
    (64, 200),  # the one INT32 [16] the dims hold, batch 1
    (0, "input byte size mismatch for input 'INPUT0' for model 'one_input'. Expected 64, got 0"),
    (128, "input byte size mismatch for input 'INPUT0' for model 'one_input'. Expected 64, got 128"),
])
def test_raw_binary_body_must_fill_fixed_dims(add_model, toy_server, size: int,  # type: ignore[no-untyped-def]
                                              answer: int | str) -> None:
    add_model("one_input", ONE_INPUT)
    server = toy_server()
    response = httpx.post(f"http://{server.http_url}/v2/models/one_input/infer", content=bytes(size),
                          headers={"Inference-Header-Content-Length": "0"})
    if answer == 200:
        assert response.status_code == 200, response.text
    else:
        assert (response.status_code, response.json()["error"]) == (400, answer)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_server_metadata_lists_exactly_what_works(protocol: str, add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("strings", STRINGS)
    _, client = _client(protocol, toy_server())
    metadata = client.get_server_metadata()
    extensions = metadata["extensions"] if protocol == "http" else list(metadata.extensions)
    assert set(extensions) == EXTENSIONS
    assert len(extensions) == len(EXTENSIONS)


GROWING = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            wide = np.repeat(x, 3, axis=1)  # 3x as many columns as the input had
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", wide), pb_utils.Tensor("FIXED", x[:, :1])]))
        return responses
'''


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_python_models_variable_output_dims_pass_through(protocol: str, tmp_path, tserve) -> None:  # type: ignore[no-untyped-def]
    model = tmp_path / "models" / "growing"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(GROWING)
    (model / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 4\n'
                                        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                                        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },\n'
                                        '         { name: "FIXED" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    module, client = _client(protocol, tserve(tmp_path / "models", frontend_processes=0))
    tensor = module.InferInput("X", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32))
    result = client.infer("growing", [tensor])
    assert result.as_numpy("Y").tolist() == [[1.0, 1.0, 1.0, 2.0, 2.0, 2.0]]
    assert result.as_numpy("FIXED").tolist() == [[1.0]]
