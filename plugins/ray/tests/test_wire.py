"""Requests and responses cross between the ingress and a replica (pickled, as Ray sends them) in the core's
wire form, every datatype unchanged."""
from __future__ import annotations

import pickle

from triton_serve.plugin import InferenceRequest, InferenceResponse, RequestedOutput, ServerError, Status, Tensor
from triton_serve.testing import assert_same_tensor, wire_samples
from triton_serve_ray.wire import Reply, WireRequest, WireResponse


def test_every_datatype_crosses_between_ingress_and_replica_unchanged() -> None:
    samples = wire_samples()
    tensors = {name: Tensor(name, datatype, array.shape, array, {"k": 1}) for name, datatype, array in samples}
    request = InferenceRequest("m", 2, id="r", inputs=tensors, outputs=[RequestedOutput("y")], parameters={"p": "v"})
    received = pickle.loads(pickle.dumps(WireRequest.of(request))).to_request()
    assert (received.model_name, received.model_version, received.id, received.parameters) == ("m", 2, "r", {"p": "v"})
    assert [output.name for output in received.outputs] == ["y"]
    for name, datatype, array in samples:
        tensor = received.inputs[name]
        assert (tensor.datatype, tensor.shape, tensor.parameters) == (datatype, array.shape, {"k": 1})
        assert_same_tensor(tensor.data, array, datatype)
    response = InferenceResponse(list(tensors.values()), {"n": 3})
    wire = pickle.loads(pickle.dumps(WireResponse.of(response, 2)))
    assert wire.model_version == 2 and wire.to_response().parameters == {"n": 3}
    for tensor, (name, datatype, array) in zip(wire.to_response().outputs, samples):
        assert tensor.name == name
        assert_same_tensor(tensor.data, array, datatype)


def test_a_replica_error_keeps_its_status() -> None:
    reply = pickle.loads(pickle.dumps(Reply.failed(ServerError("no such version", Status.NOT_FOUND))))
    try:
        reply.unwrap()
    except ServerError as error:
        assert (error.message, error.status) == ("no such version", Status.NOT_FOUND)
    else:
        raise AssertionError("unwrap did not raise")
