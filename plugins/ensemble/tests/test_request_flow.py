"""What one ensemble request runs and carries, as Triton 2.51 does it: only the steps its requested outputs
need, the request's sequence fields to every step and back in the response, and a tensor a step leaves out
passed on as absent."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.plugin import BackendRegistry, InferenceRequest, InferenceResponse, ModelSpec, Tensor, hookimpl
from triton_serve.testing import ToyBackend


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    """One ``ensemble_scheduling`` step in config text."""
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1{maps} }}'


def tensor(name: str, dims: str = "[ 2 ]", datatype: str = "TYPE_FP32") -> str:
    return f'{{ name: "{name}" data_type: {datatype} dims: {dims} }}'


def ensemble(inputs: list[str], outputs: list[str], steps: list[str]) -> str:
    return (f'platform: "ensemble"\nmax_batch_size: 0\ninput [ {", ".join(inputs)} ]\n'
            f'output [ {", ".join(outputs)} ]\nensemble_scheduling {{ step [ {", ".join(steps)} ] }}\n')


def fp32(name: str, values: list[float], client: Any = httpclient) -> Any:
    tensor = client.InferInput(name, [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, np.float32))
    return tensor


IDENTITY = """
backend: "toy_identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
# toy_identity answers OUTPUTn for each INPUTn it gets: without INPUT1 it leaves OUTPUT1 out
PASS = """
backend: "toy_identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 2 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
SEQUENCE_ECHO = """
backend: "sequence_echo"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "CORRID" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "FLAGS" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""


def _echo_sequence(model: ModelSpec, request: InferenceRequest) -> InferenceResponse:
    """OUTPUT0 = INPUT0, CORRID = the request's correlation id as text, FLAGS = its sequence flags (start 1,
    end 2). With the config parameter ``override`` its response sets the sequence fields of what follows."""
    data = request.inputs["INPUT0"]
    flags = int(request.sequence_start) | int(request.sequence_end) << 1
    outputs = [Tensor("OUTPUT0", data.datatype, data.shape, data.data),
               Tensor("CORRID", "BYTES", (1,), np.array([str(request.sequence_id).encode()], dtype=object)),
               Tensor("FLAGS", "UINT32", (1,), np.array([flags], np.uint32))]
    overrides = {"sequence_id": 99, "sequence_end": True} if "override" in model.config.parameters else {}
    return InferenceResponse(outputs, parameters=overrides)


class SequenceEchoPlugin:
    """Registers ``sequence_echo``: a toy backend that shows the sequence fields each request reached it with."""

    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        """Register the ``sequence_echo`` backend."""
        registry.add(type("SequenceEcho", (ToyBackend,), {"name": "sequence_echo", "run": staticmethod(_echo_sequence),
                                                          "platforms": (), "default_model_filename": "echo.toy"}))


def counts(client: httpclient.InferenceServerClient) -> dict[str, int]:
    """Executions per model, from the statistics extension."""
    return {s["name"]: s["execution_count"] for s in client.get_inference_statistics()["model_stats"]}


def test_only_the_steps_the_requested_outputs_need_run(add_model, serve) -> None:  # type: ignore[no-untyped-def]
    for name in ("first", "left", "right"):
        add_model(name, IDENTITY)
    # A -> first -> SHARED -> left -> LEFT, and SHARED -> right -> RIGHT
    add_model("fork", ensemble([tensor("A")], [tensor("SHARED"), tensor("LEFT"), tensor("RIGHT")], [
        step("first", {"INPUT0": "A"}, {"OUTPUT0": "SHARED"}),
        step("left", {"INPUT0": "SHARED"}, {"OUTPUT0": "LEFT"}),
        step("right", {"INPUT0": "SHARED"}, {"OUTPUT0": "RIGHT"})]))
    server = serve()
    http = httpclient.InferenceServerClient(server.http_url)
    # (Triton 2.51 prunes 'first' too here, as SHARED is not asked for, and fails with "unexpected deadlock")
    left = http.infer("fork", [fp32("A", [1, 2])], outputs=[httpclient.InferRequestedOutput("LEFT")])
    assert left.as_numpy("LEFT").tolist() == [1, 2] and left.as_numpy("RIGHT") is None
    assert left.as_numpy("SHARED") is None
    assert counts(http) == {"first": 1, "left": 1, "right": 0, "fork": 1}  # Triton's statistics: right never ran
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    right = grpc.infer("fork", [fp32("A", [3, 4], grpcclient)], outputs=[grpcclient.InferRequestedOutput("RIGHT")])
    assert right.as_numpy("RIGHT").tolist() == [3, 4] and right.as_numpy("LEFT") is None
    assert counts(http) == {"first": 2, "left": 1, "right": 1, "fork": 2}
    both = grpc.infer("fork", [fp32("A", [5, 6], grpcclient)])  # no outputs named: all of them
    assert both.as_numpy("LEFT").tolist() == [5, 6] and both.as_numpy("RIGHT").tolist() == [5, 6]
    assert both.as_numpy("SHARED").tolist() == [5, 6]
    assert counts(http) == {"first": 3, "left": 2, "right": 2, "fork": 3}


@pytest.mark.parametrize("frontend_processes", [0, 2])
def test_sequence_fields_reach_every_step_and_come_back(add_model, serve, frontend_processes: int) -> None:  # type: ignore[no-untyped-def]
    add_model("echo", SEQUENCE_ECHO)
    add_model("echo_override", SEQUENCE_ECHO + 'parameters { key: "override" value: { string_value: "1" } }\n')
    outputs = [tensor("OUT"), tensor("CORRID", "[ 1 ]", "TYPE_STRING"), tensor("FLAGS", "[ 1 ]", "TYPE_UINT32")]
    mapped = {"OUTPUT0": "OUT", "CORRID": "CORRID", "FLAGS": "FLAGS"}
    add_model("seq", ensemble([tensor("IN")], outputs, [step("echo", {"INPUT0": "IN"}, mapped)]))
    # the first step's response sets sequence_id 99 and sequence_end: the next step gets those instead
    add_model("relay", ensemble([tensor("IN")], outputs, [
        step("echo_override", {"INPUT0": "IN"}, {"OUTPUT0": "mid"}), step("echo", {"INPUT0": "mid"}, mapped)]))
    server = serve(("sequence_echo", SequenceEchoPlugin()), frontend_processes=frontend_processes)
    http = httpclient.InferenceServerClient(server.http_url)

    def seen(result: Any) -> tuple[bytes, int]:
        return result.as_numpy("CORRID")[0], int(result.as_numpy("FLAGS")[0])

    result = http.infer("seq", [fp32("IN", [1, 2])], sequence_id=42, sequence_start=True)
    assert seen(result) == (b"42", 1)
    assert result.get_response()["parameters"] == {"sequence_id": 42, "sequence_start": True, "sequence_end": False}
    plain = http.infer("seq", [fp32("IN", [1, 2])])  # Triton sets them on every ensemble response
    assert seen(plain) == (b"0", 0)
    assert plain.get_response()["parameters"] == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    relayed = http.infer("relay", [fp32("IN", [1, 2])], sequence_id=5, sequence_start=True)
    assert seen(relayed) == (b"99", 2)
    assert relayed.get_response()["parameters"] == {"sequence_id": 99, "sequence_start": False, "sequence_end": True}

    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    answer = grpc.infer("seq", [fp32("IN", [1, 2], grpcclient)], sequence_id="abc", sequence_end=True)
    assert seen(answer) == (b"abc", 2)
    parameters = answer.get_response().parameters
    assert parameters["sequence_id"].string_param == "abc"
    assert not parameters["sequence_start"].bool_param and parameters["sequence_end"].bool_param
    relayed = grpc.infer("relay", [fp32("IN", [1, 2], grpcclient)], sequence_id="abc", sequence_start=True)
    assert seen(relayed) == (b"99", 2)
    # a string sequence id gets a string parameter back, and 99 is no string: Triton answers ""
    assert relayed.get_response().parameters["sequence_id"].string_param == ""


def test_a_tensor_a_step_leaves_out_is_absent_downstream(add_model, serve) -> None:  # type: ignore[no-untyped-def]
    add_model("pass", PASS)
    add_model("plain", IDENTITY)
    # pass gets no INPUT1, so it answers no OUTPUT1: 'left_out' never exists
    add_model("gap", ensemble([tensor("A")], [tensor("OUT"), tensor("OUT1")], [
        step("pass", {"INPUT0": "A"}, {"OUTPUT0": "kept", "OUTPUT1": "left_out"}),
        step("pass", {"INPUT0": "kept", "INPUT1": "left_out"}, {"OUTPUT0": "OUT", "OUTPUT1": "OUT1"})]))
    add_model("needs_it", ensemble([tensor("A")], [tensor("OUT")], [
        step("pass", {"INPUT0": "A"}, {"OUTPUT1": "left_out"}),
        step("plain", {"INPUT0": "left_out"}, {"OUTPUT0": "OUT"})]))
    server = serve()
    http = httpclient.InferenceServerClient(server.http_url)
    result = http.infer("gap", [fp32("A", [1, 2])])  # the second step ran without its optional INPUT1
    assert result.as_numpy("OUT").tolist() == [1, 2] and result.as_numpy("OUT1") is None
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    answer = grpc.infer("gap", [fp32("A", [3, 4], grpcclient)])
    assert answer.as_numpy("OUT").tolist() == [3, 4] and answer.as_numpy("OUT1") is None
    # an ensemble output that was never made is left out of the response, not an error
    empty = grpc.infer("gap", [fp32("A", [3, 4], grpcclient)], outputs=[grpcclient.InferRequestedOutput("OUT1")])
    assert not empty.get_response().outputs
    empty = http.infer("gap", [fp32("A", [3, 4])], outputs=[httpclient.InferRequestedOutput("OUT1")])
    assert not empty.get_response()["outputs"] and "parameters" not in empty.get_response()
    # a required input fed by a tensor that was left out fails the next step as a missing input does
    with pytest.raises(InferenceServerException,
                       match=r"in ensemble 'needs_it', expected 1 inputs but got 0 inputs for model 'plain'"):
        http.infer("needs_it", [fp32("A", [1, 2])])
