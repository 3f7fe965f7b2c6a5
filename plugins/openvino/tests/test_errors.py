"""Broken models and bad configs fail to load with a message naming the model and the fault; the server
keeps serving the good model beside them."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer, pretend_gpus
from triton_serve_openvino.backend import OpenVinoBackend

MLP = """
    backend: "openvino"
    max_batch_size: 8
    input [{{ name: "{input}", data_type: {dtype}, dims: {dims} }}]
    output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: {out_dims} }}]
    {extra}
"""


def mlp_config(input: str = "INPUT0", dtype: str = "TYPE_FP32", dims: str = "[4]", out_dims: str = "[3]",
               extra: str = "") -> str:
    return MLP.format(input=input, dtype=dtype, dims=dims, out_dims=out_dims, extra=extra)


def parameter(key: str, value: str) -> str:
    return f'parameters [{{ key: "{key}", value: {{ string_value: "{value}" }} }}]'


# model name -> (files: an IR built below, or {filename: bytes or a key of `models`}, config,
#                words its load failure must hold)
BROKEN: dict[str, tuple[Any, str | None, list[str]]] = {
    "no_model_file": ({"model.onnx": "mlp_onnx"}, mlp_config(),
                      ["model 'no_model_file'", "model file 'model.xml' not found",
                       'set default_model_filename: "model.onnx"']),
    "corrupt_xml": ({"model.xml": b"<net>not a model", "model.bin": b""}, mlp_config(),
                    ["model 'corrupt_xml'", "cannot read model file 'model.xml' (weights 'model.bin')",
                     "Unable to read the model"]),
    "missing_bin": ({"model.xml": "mlp_xml"}, mlp_config(),
                    ["model 'missing_bin'", "'model.xml' (weights 'model.bin')", "bin file cannot be found"]),
    "corrupt_onnx": ({"model.onnx": b"\x08\x07garbage" * 20}, mlp_config() + 'default_model_filename: "model.onnx"',
                     ["model 'corrupt_onnx'", "cannot read model file 'model.onnx'"]),
    "wrong_dims": ("ir", mlp_config(dims="[5]"),
                   ["model 'wrong_dims'", "input 'INPUT0' dims", "dimension 0 is 5 in the config but 4 in the model"]),
    "wrong_name": ("ir", mlp_config(input="IMAGE"),
                   ["model 'wrong_name'", "input 'IMAGE' name", "no input of that name (its inputs: INPUT0)"]),
    "wrong_output_rank": ("ir", mlp_config(out_dims="[3, 1]"),
                          ["model 'wrong_output_rank'", "output 'OUTPUT0' dims", "the config gives 3 dimensions",
                           "[?,3]"]),
    "string_input": ("ir", mlp_config(dtype="TYPE_STRING"),
                     ["model 'string_input'", "input 'INPUT0' data_type", "TYPE_STRING is not served"]),
    "string_model": ("strings", 'backend: "openvino"',
                     ["model 'string_model'", "input 'TEXT'", "element type 'string'"]),
    "bad_streams": ("ir", mlp_config(extra=parameter("NUM_STREAMS", "many")),
                    ["backend 'openvino': model 'bad_streams' parameter 'NUM_STREAMS' has invalid value 'many': "
                     "expected AUTO, NUMA or an integer >= 0"]),
    "bad_hint": ("ir", mlp_config(extra=parameter("PERFORMANCE_HINT", "FASTEST")),
                 ["model 'bad_hint' parameter 'PERFORMANCE_HINT' has invalid value 'FASTEST': expected one of "
                  "LATENCY"]),
    "bad_threads": ("ir", mlp_config(extra=parameter("INFERENCE_NUM_THREADS", "-2")),
                    ["model 'bad_threads' parameter 'INFERENCE_NUM_THREADS' has invalid value '-2': expected an "
                     "integer >= 0"]),
    "bad_flag": ("ir", mlp_config(extra=parameter("SKIP_OV_DYNAMIC_BATCHSIZE", "maybe")),
                 ["model 'bad_flag' parameter 'SKIP_OV_DYNAMIC_BATCHSIZE' has invalid value 'maybe': expected "
                  "one of YES, NO"]),
    "missing_extension": ("ir", mlp_config(extra=parameter("CPU_EXTENSION_PATH", "/nonexistent/libext.so")),
                          ["model 'missing_extension'", "parameter CPU_EXTENSION_PATH: OpenVINO cannot load "
                           "'/nonexistent/libext.so'", "cannot open shared object file"]),
    "output_not_batched": ("column_sums", """
        backend: "openvino"
        max_batch_size: 4
        input [{ name: "X", data_type: TYPE_FP32, dims: [3] }]
        output [{ name: "TOTAL", data_type: TYPE_FP32, dims: [1] }]
    """, ["model 'output_not_batched'", "output 'TOTAL' dims", "the config gives 2 dimensions [-1 (batch), 1], but "
          "the model's output has shape [3]"]),
    "missing_input": ("ints", """
        backend: "openvino"
        input [{ name: "A", data_type: TYPE_INT32, dims: [-1, 3] }]
    """, ["model 'missing_input'", "input 'B' is missing from the config's input list"]),
    "variable_but_fixed": ("ints", """
        backend: "openvino"
        input [{ name: "A", data_type: TYPE_INT32, dims: [-1, -1] },
               { name: "B", data_type: TYPE_INT32, dims: [-1, -1] },
               { name: "H", data_type: TYPE_FP16, dims: [-1, -1] }]
    """, ["model 'variable_but_fixed'", "input 'A' dims", "dimension 1 is -1 (variable) in the config but fixed at 3",
          "RESHAPE_IO_LAYERS"]),
}


def _strings_model(path: Path) -> None:
    text = ops.parameter([-1], ov.Type.string, name="TEXT")
    ov.save_model(ov.Model([ops.result(text)], [text]), str(path))


def _column_sums_model(path: Path) -> None:
    """X [-1, 3] -> TOTAL [3]: the sum over the batch, so TOTAL has no batch dimension."""
    x = ops.parameter([-1, 3], ov.Type.f32, name="X")
    total = ops.reduce_sum(x, ops.constant(np.array([0], np.int64)), keep_dims=False)
    total.output(0).set_names({"TOTAL"})
    ov.save_model(ov.Model([total.output(0)], [x]), str(path))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path], kit: Any) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("broken")
    built = tmp_path_factory.mktemp("built")
    ir_files = {"ir": models["mlp_xml"], "ints": models["ints_xml"], "strings": built / "strings.xml",
                "column_sums": built / "column_sums.xml"}
    _strings_model(ir_files["strings"])
    _column_sums_model(ir_files["column_sums"])
    for name, (files, config, _) in BROKEN.items():
        if isinstance(files, str):
            files = {"model.xml": ir_files[files], "model.bin": ir_files[files].with_suffix(".bin")}
        else:
            files = {filename: source if isinstance(source, bytes) else models[source]
                     for filename, source in files.items()}
        kit.write_model(repo, name, files, config)
    kit.write_model(repo, "good", {"model.xml": models["mlp_xml"], "model.bin": models["mlp_xml"].with_suffix(".bin")},
                    mlp_config())
    server = kit.start_server(repo)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reasons(served: RunningServer) -> dict[str, str]:
    client = httpclient.InferenceServerClient(served.http_url)
    try:
        index = client.get_model_repository_index()
    finally:
        client.close()
    return {entry["name"]: entry.get("reason", "") for entry in index if entry.get("state") != "READY"}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_load_fails_with_a_reason_naming_model_and_fault(name: str, reasons: dict[str, str]) -> None:
    assert name in reasons, f"{name} loaded, but should have failed"
    for words in BROKEN[name][2]:
        assert words in reasons[name]
    assert "Exception from src/" not in reasons[name]  # OpenVINO's source locations are cut out


def test_the_good_model_still_serves_and_the_broken_ones_answer_with_errors(served: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        assert client.is_model_ready("good")
        x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("good", [x]).as_numpy("OUTPUT0").shape == (1, 3)
        assert not client.is_model_ready("corrupt_xml")
        with pytest.raises(InferenceServerException, match="corrupt_xml"):
            client.infer("corrupt_xml", [x])
    finally:
        client.close()


def test_kind_gpu_is_rejected_even_where_a_gpu_is_visible(tserve: Any, repo: Path, models: dict[str, Path],
                                                          kit: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pretend_gpus(monkeypatch, [0])  # as on a machine with a GPU
    files = {"model.xml": models["mlp_xml"], "model.bin": models["mlp_xml"].with_suffix(".bin")}
    kit.write_model(repo, "on_gpu", files, mlp_config(extra="instance_group [{ kind: KIND_GPU, gpus: [0] }]"))
    server = tserve(repo)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        [entry] = client.get_model_repository_index()
    finally:
        client.close()
    assert entry["state"] == "UNAVAILABLE"
    assert "model 'on_gpu': instance group 'on_gpu_0' has kind KIND_GPU, but the openvino backend runs models " \
           "on the CPU only; use kind: KIND_CPU" in entry["reason"]


def test_unavailable_reason_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    assert OpenVinoBackend().unavailable_reason() is None
    monkeypatch.setitem(sys.modules, "openvino", None)  # makes `import openvino` raise ImportError
    reason = OpenVinoBackend().unavailable_reason()
    assert reason is not None and "pip install openvino" in reason
