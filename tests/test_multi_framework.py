"""One repository, every framework plugin side by side: the same torch network served as ONNX,
TorchScript, a torch.export program and OpenVINO IR, plus an XGBoost model through FIL, each
compared with its framework run in-process, through tritonclient HTTP and gRPC."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

torch = pytest.importorskip("torch")
onnxruntime = pytest.importorskip("onnxruntime")
openvino = pytest.importorskip("openvino")
xgboost = pytest.importorskip("xgboost")
for plugin in ("triton_serve_onnx", "triton_serve_torch", "triton_serve_openvino", "triton_serve_fil",
               "triton_serve_batching"):
    pytest.importorskip(plugin)

MLP_IO = """
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def _network() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()


def _write(repo: Path, name: str, config: str, files: dict[str, Any]) -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    for filename, write in files.items():
        write(version / filename)
    return version


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The repository, and for each model a function computing its expected output in-process."""
    repo = tmp_path_factory.mktemp("frameworks")
    network = _network()
    example = torch.randn(2, 4)
    batch = torch.export.Dim("batch", min=1, max=8)

    onnx_dir = _write(repo, "mlp_onnx", 'backend: "onnxruntime"\n' + MLP_IO, {})
    with warnings.catch_warnings():  # the torch exporter warns about its own internals
        warnings.simplefilter("ignore")
        torch.onnx.export(network, (example,), str(onnx_dir / "model.onnx"), input_names=["INPUT__0"],
                          output_names=["OUTPUT__0"], dynamic_shapes=({0: batch},), dynamo=True,
                          external_data=False, verbose=False)
        scripted = torch.jit.trace(network, example)
    _write(repo, "mlp_torchscript", 'backend: "pytorch"\n' + MLP_IO, {"model.pt": lambda p: scripted.save(str(p))})
    exported = torch.export.export(network, (example,), dynamic_shapes=({0: batch},))
    _write(repo, "mlp_exported", 'backend: "pytorch"\n' + MLP_IO,
           {"model.pt2": lambda p: torch.export.save(exported, str(p))})
    ir = openvino.convert_model(str(onnx_dir / "model.onnx"))
    # HINT_BF16: NO, or OpenVINO computes in bf16 on CPUs that have it
    _write(repo, "mlp_openvino", 'backend: "openvino"\n' + MLP_IO +
           'parameters { key: "HINT_BF16" value: { string_value: "NO" } }',
           {"model.xml": lambda p: openvino.save_model(ir, str(p), compress_to_fp16=False)})

    rows = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)
    booster = xgboost.train({"objective": "binary:logistic", "max_depth": 3},
                            xgboost.DMatrix(rows, label=(rows[:, 0] > 0).astype(np.float32)), num_boost_round=20)
    _write(repo, "trees", """
backend: "fil"
max_batch_size: 8
input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters [ { key: "model_type" value: { string_value: "xgboost_json" } },
             { key: "output_class" value: { string_value: "false" } } ]
dynamic_batching { }
""", {"xgboost.json": lambda p: booster.save_model(str(p))})

    def run_torch(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return network(torch.from_numpy(x)).numpy()

    expected = {"mlp_onnx": run_torch, "mlp_torchscript": run_torch, "mlp_exported": run_torch,
                "mlp_openvino": run_torch,
                "trees": lambda x: booster.inplace_predict(x).reshape(-1)}  # FIL squeezes [batch, 1]
    return repo, expected


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_every_framework_serves_side_by_side(repository, tserve, module) -> None:  # type: ignore[no-untyped-def]
    repo, expected = repository
    server = tserve(repo)
    client = module.InferenceServerClient(server.http_url if module is httpclient else server.grpc_url)
    index = client.get_model_repository_index()
    states = {m["name"]: m["state"] for m in index} if module is httpclient else \
        {m.name: m.state for m in index.models}
    assert states == dict.fromkeys(expected, "READY")
    rows = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    for name, compute in expected.items():
        input_name, output_name = ("input__0", "output__0") if name == "trees" else ("INPUT__0", "OUTPUT__0")
        tensor = module.InferInput(input_name, list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        served = client.infer(name, [tensor]).as_numpy(output_name)
        np.testing.assert_allclose(served, compute(rows), rtol=1e-4, atol=1e-5, err_msg=name)
