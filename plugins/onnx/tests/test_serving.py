"""ONNX models served over HTTP and gRPC answer exactly what onnxruntime run in-process answers."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as http

from triton_serve_onnx.runner import SessionRunner

ONE = {"onnxruntime": {"default-max-batch-size": "1"}}  # batching models without a dynamic batcher
ALL_DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                 "FP16", "FP32", "FP64", "BYTES"]


def _sample(datatype: str, rows: int, rng: np.random.Generator) -> np.ndarray:
    if datatype == "BOOL":
        return rng.integers(0, 2, (rows, 2)).astype(bool)
    if datatype == "BYTES":
        return np.array([[f"r{r}c{c}-é".encode() for c in range(2)] for r in range(rows)], dtype=np.object_)
    dtype = np.dtype(http.triton_to_np_dtype(datatype))
    if dtype.kind == "f":
        return rng.standard_normal((rows, 2)).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, (rows, 2), dtype=dtype, endpoint=True)


def test_torch_mlp_over_http_and_grpc_matches_onnxruntime(kit: Any, tmp_path: Path, tserve: Any, clients: Any,
                                                          mlp_model: bytes) -> None:
    kit.write_model(tmp_path, "mlp", mlp_model, """
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [{name: "INPUT0", data_type: TYPE_FP32, dims: [4]}]
        output [{name: "OUTPUT0", data_type: TYPE_FP32, dims: [3]}]
    """)
    http_client, grpc_client = clients(tserve(tmp_path))
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    expected = kit.reference(mlp_model, {"INPUT0": x})["OUTPUT0"]
    for client in (http_client, grpc_client):
        got = kit.infer(client, "mlp", INPUT0=x).as_numpy("OUTPUT0")
        assert got.shape == (5, 3)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert http_client.get_model_metadata("mlp")["platform"] == "onnxruntime_onnx"


@pytest.mark.parametrize("filename", ["mlp.onnx", "exported/model.onnx"], ids=["file", "directory"])
def test_default_model_filename_names_the_file_or_a_directory_holding_model_onnx(
        kit: Any, tmp_path: Path, tserve: Any, clients: Any, mlp_model: bytes, filename: str) -> None:
    config = f'backend: "onnxruntime"\ndefault_model_filename: "{filename.split("/")[0]}"'
    kit.write_model(tmp_path, "mlp", mlp_model, config, filename=filename)
    http_client, _ = clients(tserve(tmp_path, backend_config=ONE))
    x = np.ones((1, 4), dtype=np.float32)
    np.testing.assert_allclose(kit.infer(http_client, "mlp", INPUT0=x).as_numpy("OUTPUT0"),
                               kit.reference(mlp_model, {"INPUT0": x})["OUTPUT0"], rtol=1e-5, atol=1e-6)


def test_every_datatype_round_trips_over_http_and_grpc(kit: Any, tmp_path: Path, tserve: Any,
                                                       clients: Any) -> None:
    model = kit.identity_model(ALL_DATATYPES)
    kit.write_model(tmp_path, "identity", model, 'backend: "onnxruntime"\nmax_batch_size: 4')
    http_client, grpc_client = clients(tserve(tmp_path))
    rng = np.random.default_rng(2)
    arrays = {f"IN_{t}": _sample(t, 3, rng) for t in ALL_DATATYPES}
    text = np.array([[value.decode() for value in row] for row in arrays["IN_BYTES"]], dtype=np.object_)
    expected = kit.reference(model, {**arrays, "IN_BYTES": text})
    for client in (http_client, grpc_client):
        result = kit.infer(client, "identity", **arrays)
        for datatype in ALL_DATATYPES:
            got = result.as_numpy(f"OUT_{datatype}")
            want = arrays[f"IN_{datatype}"]
            if datatype == "BYTES":
                assert got.tolist() == want.tolist()
                assert [[v.decode() for v in row] for row in got] == expected[f"OUT_{datatype}"].tolist()
            else:
                assert got.dtype == want.dtype, datatype
                np.testing.assert_array_equal(got, expected[f"OUT_{datatype}"])
                np.testing.assert_array_equal(got, want)


def test_string_model_processes_utf8_text(kit: Any, tmp_path: Path, tserve: Any, clients: Any) -> None:
    model = kit.strings_model()
    kit.write_model(tmp_path, "shout", model)
    http_client, grpc_client = clients(tserve(tmp_path, backend_config=ONE))
    text = np.array([["héllo".encode(), b""]], dtype=np.object_)
    expected = kit.reference(model, {"TEXT": np.array([["héllo", ""]], dtype=np.object_)})["SHOUT"]
    for client in (http_client, grpc_client):
        got = kit.infer(client, "shout", TEXT=text).as_numpy("SHOUT")
        assert got.tolist() == [[value.encode() for value in row] for row in expected] == [["héllo!".encode(), b"!"]]


def test_non_utf8_bytes_are_a_clear_request_error(kit: Any, tmp_path: Path, tserve: Any, clients: Any) -> None:
    kit.write_model(tmp_path, "shout", kit.strings_model())
    http_client, _ = clients(tserve(tmp_path, backend_config=ONE))
    with pytest.raises(Exception, match="input 'TEXT' of model 'shout' holds bytes that are not UTF-8") as caught:
        kit.infer(http_client, "shout", TEXT=np.array([[b"ok", b"\xff\xfe"]], dtype=np.object_))
    assert caught.value.status() == "400"
    assert kit.infer(http_client, "shout", TEXT=np.array([[b"a", b"b"]], dtype=np.object_)).as_numpy("SHOUT") \
        .tolist() == [[b"a!", b"b!"]]


def test_bf16_inputs_and_outputs(kit: Any, tmp_path: Path, tserve: Any, clients: Any) -> None:
    kit.write_model(tmp_path, "bf16", kit.bf16_model(), """
        backend: "onnxruntime"
        max_batch_size: 4
        input [{name: "F32", data_type: TYPE_FP32, dims: [2]}, {name: "B16", data_type: TYPE_BF16, dims: [2]}]
        output [{name: "TO_BF16", data_type: TYPE_BF16, dims: [2]},
                {name: "FROM_BF16", data_type: TYPE_FP32, dims: [2]}]
    """)
    kit.write_model(tmp_path, "bf16_input_only", kit.bf16_model(), """
        backend: "onnxruntime"
        max_batch_size: 4
        input [{name: "F32", data_type: TYPE_FP32, dims: [2]}, {name: "B16", data_type: TYPE_BF16, dims: [2]}]
        output [{name: "FROM_BF16", data_type: TYPE_FP32, dims: [2]}]
    """)
    ml_dtypes = pytest.importorskip("ml_dtypes")  # tritonclient's BF16 arrays
    values = np.array([[1.5, -2.25], [3.0, 0.0078125]], dtype=np.float32)  # exact in bfloat16
    for client in clients(tserve(tmp_path)):
        result = kit.infer(client, "bf16", F32=values, B16=values.astype(ml_dtypes.bfloat16))
        assert result.as_numpy("TO_BF16").dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(result.as_numpy("TO_BF16").astype(np.float32), values)
        np.testing.assert_array_equal(result.as_numpy("FROM_BF16"), values)
        # a config that leaves TO_BF16 out: the session takes a BF16 input and returns only numpy outputs
        result = kit.infer(client, "bf16_input_only", F32=values, B16=values.astype(ml_dtypes.bfloat16))
        np.testing.assert_array_equal(result.as_numpy("FROM_BF16"), values)


def test_variable_dimensions(kit: Any, tmp_path: Path, tserve: Any, clients: Any) -> None:
    model = kit.double_model()
    kit.write_model(tmp_path, "double", model)  # no config: auto-complete gives dims [-1]
    http_client, grpc_client = clients(tserve(tmp_path, backend_config=ONE))
    for client, length in ((http_client, 3), (grpc_client, 7)):
        x = np.arange(length, dtype=np.float32).reshape(1, length)
        got = kit.infer(client, "double", X=x).as_numpy("Y")
        np.testing.assert_array_equal(got, kit.reference(model, {"X": x})["Y"])
        assert got.shape == (1, length)


def test_scalar_tensors_travel_as_one_element(kit: Any, tmp_path: Path, tserve: Any, clients: Any) -> None:
    model = kit.double_model(shape=[])
    kit.write_model(tmp_path, "scalar", model)
    http_client, grpc_client = clients(tserve(tmp_path))
    config = http_client.get_model_config("scalar")
    assert (config["max_batch_size"], config["input"][0]["dims"], config["output"][0]["dims"]) == (0, [1], [1])
    for client in (http_client, grpc_client):
        got = kit.infer(client, "scalar", X=np.array([2.5], dtype=np.float32)).as_numpy("Y")
        assert got.tolist() == [float(kit.reference(model, {"X": np.array(2.5, dtype=np.float32)})["Y"])] == [5.0]


def test_two_instances_run_requests_concurrently(kit: Any, tmp_path: Path, tserve: Any, clients: Any,
                                                 mlp_model: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    kit.write_model(tmp_path, "mlp", mlp_model, """
        backend: "onnxruntime"
        max_batch_size: 8
        input [{name: "INPUT0", data_type: TYPE_FP32, dims: [4]}]
        output [{name: "OUTPUT0", data_type: TYPE_FP32, dims: [3]}]
        instance_group [{count: 2, kind: KIND_CPU}]
    """)  # inputs and outputs listed: no auto-complete, so no dynamic batcher joins the requests
    running: set[int] = set()
    seen_together: list[int] = []
    lock = threading.Lock()
    both_running = threading.Barrier(2, timeout=30)
    original_run = SessionRunner.run

    def run_and_wait_for_the_other(self: SessionRunner, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with lock:
            running.add(id(self))
            seen_together.append(len(running))
        both_running.wait()  # only returns once two sessions run at the same time
        try:
            return original_run(self, arrays)
        finally:
            with lock:
                running.discard(id(self))

    monkeypatch.setattr(SessionRunner, "run", run_and_wait_for_the_other)
    _, grpc_client = clients(tserve(tmp_path))
    rows = np.random.default_rng(3).standard_normal((4, 1, 4)).astype(np.float32)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda x: kit.infer(grpc_client, "mlp", INPUT0=x).as_numpy("OUTPUT0"), rows))
    assert max(seen_together) == 2
    for x, got in zip(rows, results, strict=True):
        np.testing.assert_allclose(got, kit.reference(mlp_model, {"INPUT0": x})["OUTPUT0"], rtol=1e-5, atol=1e-6)
