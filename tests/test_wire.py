"""The one binary form of tensors and errors (wire.py), and the front-end channel that uses it: every datatype,
BYTES, zero-sized, 0-d and large tensors and shared-memory inputs cross unchanged, however the stream splits
the frames. (The Python backend's and Ray's boundaries have the same test in their plugins.)"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triton_serve._engine import channel, inference
from triton_serve.plugin import (InferenceRequest, InferenceResponse, RequestedOutput, ServerError, Status, Tensor,
                                 TensorLayout, decode_error, encode_error, pack_tensors, read_tensor, tensor_from)
from triton_serve.testing import EXAMPLE_REPOSITORY, assert_same_tensor, wire_samples

SAMPLES = wire_samples()


def _frames(data: bytes, piece: int) -> list[channel.Frame]:
    reader = channel.FrameReader()
    frames = []
    for start in range(0, len(data), piece):
        frames += reader.feed(data[start:start + piece])
    return frames


@pytest.mark.parametrize("alignment", [1, 8, 64])
def test_every_sample_round_trips_through_one_buffer(alignment: int) -> None:
    refs, data = pack_tensors(((name, datatype, array) for name, datatype, array in SAMPLES), alignment)
    assert all(ref[3] % alignment == 0 for ref in refs)
    for ref, (name, datatype, array) in zip(refs, SAMPLES):
        assert ref[:3] == (name, datatype, array.shape)
        assert_same_tensor(read_tensor(bytes(data), ref), array, datatype)
    copied = read_tensor(data, refs[0], copy=True)
    data[refs[0][3]] ^= 1  # a copy does not see later changes of the buffer; a view does
    assert copied.tolist() == SAMPLES[0][2].tolist()
    assert read_tensor(data, refs[0]).tolist() != SAMPLES[0][2].tolist()


def test_a_layout_casts_to_the_datatype_and_writes_into_a_given_buffer() -> None:
    layout = TensorLayout(64)
    ref = layout.add("x", "FP32", np.array([1, 2, 3], np.float64))  # a model's float64 for an FP32 output
    arena = memoryview(bytearray(layout.size + 16))
    layout.write(arena)
    assert read_tensor(arena, ref).dtype == np.float32 and read_tensor(arena, ref).tolist() == [1.0, 2.0, 3.0]


def test_a_size_that_does_not_match_the_shape_is_refused() -> None:
    [ref], data = pack_tensors([("x", "INT32", np.arange(4, dtype=np.int32))])
    with pytest.raises(ValueError, match="expected 12 bytes, got 16"):
        read_tensor(data, ("x", "INT32", (3,), 0, ref[4]))


def test_errors_keep_their_status() -> None:
    error = decode_error(encode_error(ServerError("input 'x' is missing", Status.INVALID_ARG)))
    assert (error.message, error.status) == ("input 'x' is missing", Status.INVALID_ARG)


@pytest.mark.parametrize("piece", [7, 1 << 16, 1 << 30])
def test_requests_cross_the_front_end_channel_unchanged(piece: int) -> None:
    inputs = {name: Tensor(name, datatype, array.shape, array) for name, datatype, array in SAMPLES}
    inputs["from_shm"] = Tensor("from_shm", "FP32", (4,), np.empty(0, np.float32),
                                {"shared_memory_region": "r", "shared_memory_byte_size": 16})
    request = InferenceRequest("m", 3, id="r-1", inputs=inputs, parameters={"priority": 2, "tag": "\u00e9"},
                               outputs=[RequestedOutput("y", {"binary_data": True})])
    [(kind, frame_id, meta, data)] = _frames(channel.encode_request(41, request, "no decoupled"), piece)
    decoded, decoupled_error = channel.decode_request(meta, data)
    assert (kind, frame_id, decoupled_error) == (channel.REQUEST, 41, "no decoupled")
    assert (decoded.model_name, decoded.model_version, decoded.id, decoded.parameters) == \
        ("m", 3, "r-1", {"priority": 2, "tag": "\u00e9"})
    assert [(o.name, o.parameters) for o in decoded.outputs] == [("y", {"binary_data": True})]
    for name, datatype, array in SAMPLES:
        tensor = decoded.inputs[name]
        assert (tensor.datatype, tensor.shape) == (datatype, array.shape)
        assert_same_tensor(tensor.data, array, datatype)
    shm = decoded.inputs["from_shm"]
    assert shm.parameters == inputs["from_shm"].parameters and shm.data.size == 0  # the owner reads the region


@pytest.mark.parametrize("piece", [5, 1 << 30])
def test_responses_and_errors_cross_the_front_end_channel_unchanged(piece: int) -> None:
    outputs = [Tensor(name, datatype, array.shape, array) for name, datatype, array in SAMPLES]
    frames = (channel.encode_response(1, InferenceResponse(outputs, {"n": 1}), False, 2)
              + channel.encode_response(1, InferenceResponse.from_error(ServerError("boom", Status.UNAVAILABLE)),
                                        False, 2)
              + channel.encode_response(1, None, True, None))
    (first, error, last) = [channel.decode_response(meta, data) for _, _, meta, data in _frames(frames, piece)]
    response, final, version = first
    assert response is not None and (final, version, response.parameters) == (False, 2, {"n": 1})
    for tensor, (name, datatype, array) in zip(response.outputs, SAMPLES):
        assert (tensor.name, tensor.datatype, tensor.shape) == (name, datatype, array.shape)
        assert_same_tensor(tensor.data, array, datatype)
    assert error[0] is not None and error[0].error is not None
    assert (error[0].error.message, error[0].error.status) == ("boom", Status.UNAVAILABLE)
    assert last == (None, True, None)


def test_a_wire_tensor_keeps_its_bytes_until_data_is_asked_for() -> None:
    [ref], data = pack_tensors([("s", "BYTES", np.array([[b"a", b"\xff\x00", b""]], dtype=object))])
    tensor = tensor_from(data, ref)
    assert tensor.wire is not None and bytes(tensor.wire_bytes()) == bytes(data) and tensor.size == 3
    tensor.reshape((3, 1))
    layout = TensorLayout(1)
    assert layout.add_tensor(tensor) == ("s", "BYTES", (3, 1), 0, len(data)) and layout.tobytes() == data
    assert tensor.data.tolist() == [[b"a"], [b"\xff\x00"], [b""]]
    tensor.data = np.array([b"b"], dtype=object)  # a new value drops the wire bytes
    assert tensor.wire is None and bytes(tensor.wire_bytes()) == b"\x01\x00\x00\x00b"
    with pytest.raises(ValueError, match="expected 2 BYTES elements, found 3"):
        tensor_from(data, ("s", "BYTES", (2,), 0, len(data)))


def test_bytes_cross_the_model_owner_in_wire_form(tserve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BYTES a client sends reach a Python model's worker, and the worker's BYTES outputs reach the client, without
    the model owner decoding them into objects (here it cannot), over binary HTTP and gRPC."""
    pytest.importorskip("triton_serve_python")
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    shutil.copytree(EXAMPLE_REPOSITORY / "identity_bytes", tmp_path / "identity_bytes")
    server = tserve(tmp_path, backend_config={"python": {"shm-region-prefix-name": f"tsw_{os.getpid()}_"}})

    def refuse(*args: Any) -> None:
        raise AssertionError("the model owner decoded a BYTES tensor")

    monkeypatch.setattr(inference, "from_wire_bytes", refuse)
    text = np.array([[b"hello", b"", "w\u00f6rld".encode(), b"\x00\xff"]], dtype=object)
    for client_module, client in ((httpclient, httpclient.InferenceServerClient(server.http_url)),
                                  (grpcclient, grpcclient.InferenceServerClient(server.grpc_url))):
        given = client_module.InferInput("INPUT0", list(text.shape), "BYTES")
        given.set_data_from_numpy(text)
        result = client.infer("identity_bytes", [given])
        assert result.as_numpy("OUTPUT0").tolist() == text.tolist()
        client.close()
