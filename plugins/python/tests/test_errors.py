"""A model's mistakes reach the client as clear errors with Triton's statuses; the model keeps serving."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer

ERROR_CODES = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                name = pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0].decode()
                error = pb_utils.TritonError(f"the model failed with {name}", getattr(pb_utils.TritonError, name))
                responses.append(pb_utils.InferenceResponse(error=error))
            return responses
"""
MISBEHAVING = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            mode = pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0].decode()
            good = np.arange(4, dtype=np.int32)
            if mode == "value_error":
                raise ValueError("bad value")
            if mode == "model_exception":
                raise pb_utils.TritonModelException("the model says no")
            if mode == "triton_error":
                raise pb_utils.TritonError("nothing here", pb_utils.TritonError.NOT_FOUND)
            if mode == "dtype":
                return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", good.astype(np.float32))])]
            if mode == "undeclared":
                return [pb_utils.InferenceResponse([pb_utils.Tensor("Z", good)])]
            if mode == "count":
                return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", good)])] * 2
            if mode == "dict":
                return {"Y": good}
            if mode == "not_a_response":
                return ["Y"]
            if mode == "float_parameter":
                return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", good)], parameters={"score": 0.5})]
            if mode == "complex":
                return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", good.astype(np.complex64))])]
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", good)])]
"""

# Output shapes are not checked against the config (Triton's rule), except that a reshaped output must fit it.
SHAPES = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            mode = pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0].decode()
            size = 3 if mode == "bad_reshape" else 4
            return [pb_utils.InferenceResponse([pb_utils.Tensor("ANY", np.array([7], np.int32)),
                                                pb_utils.Tensor("FOUR", np.arange(5, dtype=np.int32)),
                                                pb_utils.Tensor("R", np.arange(size, dtype=np.int32))])]
"""

# code name -> the HTTP status Triton gives it
HTTP_STATUS = {"INTERNAL": 500, "NOT_FOUND": 404, "INVALID_ARG": 400, "UNAVAILABLE": 503, "UNSUPPORTED": 501,
               "ALREADY_EXISTS": 400, "CANCELLED": 400, "UNKNOWN": 400}

# mode -> (HTTP status, words the error message must contain)
MISTAKES = {
    "value_error": (500, "Failed to process the request(s) for model 'misbehaving_0_0', message: ValueError: bad value"
                         "\n\nAt:\n  "),
    "model_exception": (500, "Failed to process the request(s) for model 'misbehaving_0_0', message: "
                             "TritonModelException: the model says no\n\nAt:\n  "),
    "triton_error": (404, "nothing here"),
    "dtype": (500, "returned output 'Y' with datatype 'FP32', but its config declares 'INT32'"),
    "undeclared": (500, "returned output 'Z', which its config does not declare"),
    "count": (500, "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                   "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:2"),
    "dict": (500, "Expected a list in the execute return, found type '<class 'dict'>'."),
    "not_a_response": (500, "Expected an 'InferenceResponse' object in the execute function return list, "
                            "found type '<class 'str'>'."),
    "float_parameter": (500, "response parameter 'score' must be one of bool, int, str, got float"),
    "complex": (500, "tensor 'Y' has numpy dtype complex64, which has no Triton datatype"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, kit: Any) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("errors")
    kit.write_model(repo, "error_codes", ERROR_CODES, """
        input [ { name: "CODE", data_type: TYPE_STRING, dims: [ 1 ] } ]
        output [ { name: "Y", data_type: TYPE_INT32, dims: [ 4 ] } ]
    """)
    kit.write_model(repo, "misbehaving", MISBEHAVING, """
        input [ { name: "MODE", data_type: TYPE_STRING, dims: [ 1 ] } ]
        output [ { name: "Y", data_type: TYPE_INT32, dims: [ 4 ] } ]
    """)
    kit.write_model(repo, "shapes", SHAPES, """
        input [ { name: "MODE", data_type: TYPE_STRING, dims: [ 1 ] } ]
        output [ { name: "ANY", data_type: TYPE_INT32, dims: [ -1, -1 ] },
                 { name: "FOUR", data_type: TYPE_INT32, dims: [ 4 ] },
                 { name: "R", data_type: TYPE_INT32, dims: [ 2, 2 ], reshape: { shape: [ 4 ] } } ]
    """)
    running = kit.start_server(repo, f"tsp_errors_{os.getpid()}_{uuid.uuid4().hex[:6]}_")
    yield running
    running.stop()


def _error_of(kit: Any, client: http.InferenceServerClient, model: str,
              **inputs: np.ndarray) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as raised:
        kit.infer(client, model, **inputs)
    return raised.value


@pytest.mark.parametrize("code", sorted(HTTP_STATUS))
def test_triton_error_code_becomes_the_http_status(kit: Any, client: http.InferenceServerClient, code: str) -> None:
    error = _error_of(kit, client, "error_codes", CODE=np.array([code.encode()], dtype=object))
    assert error.status() == str(HTTP_STATUS[code])
    assert error.message() == f"the model failed with {code}"


@pytest.mark.parametrize("mode", sorted(MISTAKES))
def test_model_mistakes_give_clear_errors(kit: Any, client: http.InferenceServerClient, mode: str) -> None:
    status, words = MISTAKES[mode]
    error = _error_of(kit, client, "misbehaving", MODE=np.array([mode.encode()], dtype=object))
    assert error.status() == str(status)
    assert words in error.message()


def test_model_keeps_serving_after_its_mistakes(kit: Any, client: http.InferenceServerClient) -> None:
    for mode in MISTAKES:
        _error_of(kit, client, "misbehaving", MODE=np.array([mode.encode()], dtype=object))
    result = kit.infer(client, "misbehaving", MODE=np.array([b"ok"], dtype=object))
    np.testing.assert_array_equal(result.as_numpy("Y"), np.arange(4, dtype=np.int32))
    assert client.is_server_ready() and client.is_model_ready("misbehaving")


def test_output_shapes_pass_through_as_in_triton(kit: Any, client: http.InferenceServerClient,
                                                 server: RunningServer) -> None:
    """Triton's core and python backend check no output shape against the config: [1] for dims [-1, -1] and [5]
    for dims [4] reach the client as they are; a reshaped output takes its config dims."""
    result = kit.infer(client, "shapes", MODE=np.array([b"ok"], dtype=object))
    assert result.as_numpy("ANY").tolist() == [7]
    assert result.as_numpy("FOUR").tolist() == [0, 1, 2, 3, 4]
    assert result.as_numpy("R").tolist() == [[0, 1], [2, 3]]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("MODE", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b"ok"], dtype=object))
        assert grpc.infer("shapes", [tensor]).as_numpy("ANY").tolist() == [7]
    finally:
        grpc.close()
    error = _error_of(kit, client, "shapes", MODE=np.array([b"bad_reshape"], dtype=object))
    assert error.status() == "500"
    assert error.message() == ("model 'shapes' returned output 'R' with shape [3], which cannot be reshaped to its "
                               "config dims [2, 2]")
