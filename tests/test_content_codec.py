"""wire.py's one codec for request and response content: every datatype, zero-sized and large tensors,
shared-memory inputs (no bytes cross), parameters of every kind, errors, and a field a subclass adds."""
from __future__ import annotations

import marshal
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

from triton_serve.plugin import (InferenceRequest, InferenceResponse, RequestContent, RequestedOutput, ResponseContent,
                                 ServerError, Status, Tensor, decode_content)
from triton_serve.testing import assert_same_tensor, wire_samples
from triton_serve._engine import channel
from triton_serve._engine.shared_memory_tensors import detached
from triton_serve._engine.wire import pack_content

from .conftest import DATATYPES


def crossed(content: RequestContent | ResponseContent) -> RequestContent | ResponseContent:
    """``content`` after a trip through the codec and a frame (marshal), its tensors views of the frame's bytes."""
    meta, data = pack_content(content)
    frame = channel.encode(channel.REQUEST, 1, meta, data)
    [(_kind, _id, received, buf)] = channel.FrameReader().feed(frame)
    return decode_content(type(content), received, buf)


def test_every_datatype_crosses_as_a_view_of_the_frame() -> None:
    # BF16 as the core holds it: bfloat16 bit patterns in uint16 (ml_dtypes reads them back)
    samples = [(name, name, array.view(np.uint16) if name == "BF16" else array) for name, array in DATATYPES.items()]
    assert {datatype for _, datatype, _ in wire_samples()} <= {datatype for _, datatype, _ in samples}
    inputs = tuple(Tensor(name, datatype, array.shape, array) for name, datatype, array in samples)
    content = crossed(RequestContent("m", 3, "id-1", inputs=inputs))
    assert (content.model_name, content.model_version, content.id) == ("m", 3, "id-1")
    for tensor, (name, datatype, array) in zip(content.inputs, samples):
        assert (tensor.name, tensor.datatype, tensor.shape) == (name, datatype, array.shape)
        assert tensor.wire is not None  # kept in wire form: no array until asked
        assert_same_tensor(tensor.data, array, datatype)
    assert content.inputs[-2].data.view(ml_dtypes.bfloat16).tolist() == DATATYPES["BF16"].tolist()
    assert content.inputs[-1].data.tolist() == [b"hello", b"", "ünï".encode()]  # BYTES, an empty element among them


def test_a_bfloat16_array_crosses_as_its_bit_patterns() -> None:
    array = DATATYPES["BF16"]  # ml_dtypes.bfloat16, not the uint16 patterns the core holds
    [tensor] = crossed(RequestContent("m", inputs=(Tensor("X", "BF16", array.shape, array),))).inputs
    assert tensor.data.dtype == np.uint16 and tensor.data.view(ml_dtypes.bfloat16).tolist() == array.tolist()


def test_zero_sized_and_large_tensors() -> None:
    large = np.arange(2 * 1024 * 1024, dtype=np.float32)  # 8 MiB
    inputs = (Tensor("EMPTY", "FP32", (0, 4), np.zeros((0, 4), np.float32)),
              Tensor("NONE", "BYTES", (0,), np.array([], dtype=object)), Tensor("LARGE", "FP32", large.shape, large))
    empty, none, big = crossed(RequestContent("m", inputs=inputs)).inputs
    assert empty.data.shape == (0, 4) and none.data.shape == (0,)
    assert np.array_equal(big.data, large)


def test_a_shared_memory_input_crosses_without_its_bytes() -> None:
    parameters = {"shared_memory_region": "r", "shared_memory_offset": 8, "shared_memory_byte_size": 64}
    unread = Tensor("X", "FP32", (4, 4), np.empty(0, np.float32), parameters)
    meta, data = pack_content(RequestContent("m", inputs=(unread,)))
    assert len(data) == 0
    [received] = decode_content(RequestContent, marshal.loads(marshal.dumps(meta)), memoryview(data)).inputs
    assert (received.shape, received.parameters, received.data.size) == ((4, 4), parameters, 0)
    # once the owner has read the region into the tensor, its bytes cross (to a worker process)
    read = Tensor("X", "FP32", (4, 4), np.ones((4, 4), np.float32), parameters)
    [received] = crossed(RequestContent("m", inputs=(read,))).inputs
    assert received.data.tolist() == np.ones((4, 4)).tolist()


def test_parameters_of_every_kind_and_requested_outputs() -> None:
    parameters = {"flag": True, "count": -3, "name": "ü", "ratio": 0.5, "numpy": np.int64(7)}
    content = crossed(RequestContent("m", parameters=parameters,
                                     outputs=(RequestedOutput("Y", {"binary_data": True}), RequestedOutput("Z"))))
    assert content.parameters == {"flag": True, "count": -3, "name": "ü", "ratio": 0.5, "numpy": 7}
    assert [type(value) for value in content.parameters.values()] == [bool, int, str, float, int]
    assert content.outputs == (RequestedOutput("Y", {"binary_data": True}), RequestedOutput("Z"))


def test_responses_with_outputs_or_an_error() -> None:
    words = np.array([b"a", b""], dtype=object)
    answer = crossed(ResponseContent((Tensor("W", "BYTES", (2,), words),), {"done": True}))
    assert answer.outputs[0].data.tolist() == [b"a", b""] and answer.parameters == {"done": True}
    failed = crossed(ResponseContent(error=ServerError("no such input 'Q'", Status.INVALID_ARG)))
    assert failed.error is not None and (failed.error.message, failed.error.status) == \
        ("no such input 'Q'", Status.INVALID_ARG)


@dataclass(frozen=True, slots=True)
class Routed(RequestContent):
    route: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Stamped(ResponseContent):
    stamp: int = 0


def test_a_field_a_subclass_adds_crosses_and_stays_with_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(InferenceRequest, "content_type", Routed)
    monkeypatch.setattr(InferenceResponse, "content_type", Stamped)
    x = Tensor("X", "INT32", (2,), np.array([1, 2], np.int32))
    frame = channel.encode_request(1, InferenceRequest.from_content(Routed("m", inputs=(x,), route=("a", "b"))), None)
    [(_kind, _id, meta, data)] = channel.FrameReader().feed(frame)
    request, _ = channel.decode_request(meta, data)
    request.model_version = 2  # the data plane resolves the version, a sequence batcher adds inputs
    request.inputs["START"] = Tensor("START", "BOOL", (1,), np.array([True]))
    content = request.content
    assert isinstance(content, Routed) and content.route == ("a", "b") and content.model_version == 2
    assert [tensor.name for tensor in content.inputs] == ["X", "START"]
    frame = channel.encode_response(1, InferenceResponse.from_content(Stamped(stamp=9)), True, 2)
    [(_kind, _id, meta, data)] = channel.FrameReader().feed(frame)
    response, final, version = channel.decode_response(meta, data)
    assert response is not None and (response.content, final, version) == (Stamped(stamp=9), True, 2)


def test_a_response_detached_for_the_cache_keeps_the_field_a_subclass_adds() -> None:
    """The response cache keeps a copy whose outputs own their data (``detached``): a received response's added
    fields stay with it."""
    region = np.array([1, 2], np.int32)  # a shared-memory region's bytes, which the client changes later
    received = InferenceResponse.from_content(Stamped(outputs=(Tensor("Y", "INT32", (2,), region),), stamp=9))
    cached = detached(received)
    region[:] = 0
    content = cached.content
    assert isinstance(content, Stamped) and content.stamp == 9
    assert content.outputs[0].data.tolist() == [1, 2]
