"""Broken models and bad requests: clear errors naming the model and the problem, and the server keeps serving."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpc
import tritonclient.http as http
from google.protobuf import text_format
from tritonclient.utils import InferenceServerException

from triton_serve.plugin import InstanceSpec, ModelConfig, ModelInstanceGroup, ModelSpec, ServerError, Status
from triton_serve_torch.backend import PyTorchBackend
from triton_serve_torch.options import TorchModelOptions


def test_load_failures_name_the_model_and_the_problem(repo, model_files, tserve, clients, kit):
    """One server, many broken models: each fails alone with its own reason; a good one still serves."""
    broken = {
        "no_tensors": (model_files.mlp_script, 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n',
                       ["config.pbtxt must list the model's inputs and outputs", "TorchScript"]),
        "corrupt_script": (b"not a zip archive", kit.mlp_config(), ["cannot load 'model.pt' as TorchScript"]),
        "corrupt_exported": (b"garbage", 'backend: "pytorch"\n',
                             ["cannot load 'model.pt2' as an exported program"]),
        "no_file": (None, kit.mlp_config(), ["no model file 'model.pt'"]),
        "too_many_inputs": (model_files.mlp_script, kit.mlp_config(extra="""
            input [ { name: "extra" data_type: TYPE_FP32 dims: [1] } ]"""),
                            ["lists 3 inputs", "forward takes 2"]),
        "index_out_of_range": (model_files.mlp_script, kit.mlp_config(y="INPUT__5"),
                               ["input 'INPUT__5' names index 5, but forward takes 2"]),
        "output_out_of_range": (model_files.mlp_script, kit.mlp_config(out1="OUTPUT__2"),
                                ["output 'OUTPUT__2' names index 2, but forward returns 2"]),
        "unfed_argument": (model_files.mlp_script, kit.mlp_config().replace(
            ', { name: "INPUT__1" data_type: TYPE_FP32 dims: [3] }', ""),
                           ["forward argument(s) ['y'] have no default and no config input feeds them"]),
        "strings": (model_files.mlp_script, kit.mlp_config().replace(
            'name: "OUTPUT__1" data_type: TYPE_FP32', 'name: "OUTPUT__1" data_type: TYPE_STRING'),
                    ["output 'OUTPUT__1' is TYPE_STRING"]),
        "bad_parameter": (model_files.mlp_script, kit.mlp_config(extra="""
            parameters { key: "INFERENCE_MODE" value { string_value: "maybe" } }"""),
                          ["backend 'pytorch': model 'bad_parameter' parameter 'INFERENCE_MODE' has invalid value "
                           "'maybe': expected true/false, on/off or 1/0"]),
        "bad_thread_count": (model_files.mlp_script, kit.mlp_config(extra="""
            parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "-2" } }"""),
                             ["parameter 'INTRA_OP_THREAD_COUNT' has invalid value '-2': expected an integer >= 0"]),
        "exported_wrong_dtype": (model_files.mlp_exported, kit.mlp_config().replace(
            'name: "INPUT__1" data_type: TYPE_FP32', 'name: "INPUT__1" data_type: TYPE_INT64'),
                                 ["the config declares input 'INPUT__1' as TYPE_INT64",
                                  "exported program's input 'y' is torch.float32"]),
        "exported_wrong_dims": (model_files.mlp_exported, kit.mlp_config().replace("dims: [8]", "dims: [7]"),
                                ["the config gives output 'OUTPUT__1' shape [-1, 7]", "[-1, 8]"]),
    }
    for name, (model_file, config, _) in broken.items():
        repo.add(name, model_file, config, filename="model.pt2" if "exported" in name else None)
    repo.add("good", model_files.mlp_script, kit.mlp_config())
    http_client, _ = clients(tserve(repo.root))
    for name, (_, _, fragments) in broken.items():
        reason = kit.load_failure(http_client, name)
        assert f"'{name}'" in reason, reason
        for fragment in fragments:
            assert fragment in reason, (name, reason)
    assert http_client.is_model_ready("good")


def test_backend_is_unavailable_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes "import torch" fail
    reason = PyTorchBackend().unavailable_reason()
    assert reason is not None and reason.startswith("torch cannot be imported")
    assert reason.endswith("install it with 'pip install torch'")


def test_exported_program_without_config_tensors_when_auto_complete_is_off(repo, model_files, tserve, clients, kit):
    repo.add("exported", model_files.mlp_exported, 'backend: "pytorch"\n')
    http_client, _ = clients(tserve(repo.root, disable_auto_complete_config=True))
    assert "auto-complete fills them from a model.pt2" in kit.load_failure(http_client, "exported")


def test_config_contradicting_the_model_output_fails_the_request(repo, model_files, tserve, clients):
    repo.add("mlp", model_files.mlp_script, """
        platform: "pytorch_libtorch"
        max_batch_size: 8
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [4] }, { name: "INPUT__1" data_type: TYPE_FP32 dims: [3] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [3] } ]
        """)
    http_client, _ = clients(tserve(repo.root))
    inputs = [http.InferInput("INPUT__0", [1, 4], "FP32"), http.InferInput("INPUT__1", [1, 3], "FP32")]
    for tensor, width in zip(inputs, (4, 3)):
        tensor.set_data_from_numpy(np.ones((1, width), np.float32))
    with pytest.raises(InferenceServerException) as raised:
        http_client.infer("mlp", inputs)
    assert "pytorch model 'mlp': output 'OUTPUT__0' is torch.float32, but the config declares TYPE_INT32" \
        in raised.value.message()
    assert raised.value.status() == "500"


def test_forward_failure_is_an_error_and_the_server_keeps_serving(repo, model_files, tserve, clients, kit):
    # the config lets any width through; the model's Linear(4, 8) only takes 4
    repo.add("mlp", model_files.mlp_script, kit.mlp_config().replace("dims: [4]", "dims: [-1]"))
    http_client, grpc_client = clients(tserve(repo.root))
    tensors = [grpc.InferInput("INPUT__0", [2, 5], "FP32"), grpc.InferInput("INPUT__1", [2, 3], "FP32")]
    tensors[0].set_data_from_numpy(np.ones((2, 5), np.float32))
    tensors[1].set_data_from_numpy(np.ones((2, 3), np.float32))
    with pytest.raises(InferenceServerException) as raised:
        grpc_client.infer("mlp", tensors)
    assert "pytorch model 'mlp' failed to execute" in raised.value.message()
    assert "mat1 and mat2 shapes cannot be multiplied" in raised.value.message()
    x, y = np.ones((1, 4), np.float32), np.ones((1, 3), np.float32)
    result, _ = kit.infer(http_client, grpc_client, "mlp", INPUT__0=x, INPUT__1=y)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), kit.reference(model_files.mlp, x, y)[0], rtol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_kind_gpu_without_cuda_fails_to_load_with_a_clear_message(repo, model_files, tserve, clients, kit):
    repo.add("on_gpu", model_files.mlp_script,
             kit.mlp_config(extra="instance_group [ { kind: KIND_GPU gpus: [0] } ]"))
    http_client, _ = clients(tserve(repo.root))
    reason = kit.load_failure(http_client, "on_gpu")  # the core refuses first where no GPU is visible at all
    assert "instance group on_gpu_0 of model on_gpu specifies invalid or unsupported gpu id 0" in reason, reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_kind_gpu_with_a_cpu_only_torch_is_refused_by_the_backend(repo, model_files, kit):
    """A machine can have a GPU while torch is a CPU build: the backend itself must refuse KIND_GPU."""
    version = repo.add("on_gpu", model_files.mlp_script, None)
    config = text_format.Parse(kit.mlp_config(), ModelConfig())
    spec = ModelSpec("on_gpu", 1, config, version.parent, version, PyTorchBackend.default_model_filename,
                     parameters=TorchModelOptions())
    group = ModelInstanceGroup(name="on_gpu_0", kind=ModelInstanceGroup.KIND_GPU, gpus=[0])
    with pytest.raises(ServerError) as raised:
        PyTorchBackend().create_model(spec).create_instance(InstanceSpec("on_gpu_0_0", group, 0, "GPU", 0))
    assert raised.value.status is Status.UNAVAILABLE
    assert "pytorch model 'on_gpu' instance 'on_gpu_0_0' is KIND_GPU (GPU 0), but torch" in raised.value.message
    assert "cannot use CUDA on this machine; use KIND_CPU or install a CUDA build of torch" in raised.value.message


class Pieces(torch.nn.Module):
    """Returns a list: how many results forward gives is known only once it has run."""

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x + 1, x * 2]


def test_output_index_beyond_a_returned_list_fails_the_request(repo, tmp_path, tserve, clients, kit):
    pieces = kit.script(Pieces(), tmp_path / "pieces.pt")
    for name, index in (("second", 1), ("fourth", 3)):
        repo.add(name, pieces, f"""
            backend: "pytorch"
            input [ {{ name: "x" data_type: TYPE_FP32 dims: [-1] }} ]
            output [ {{ name: "OUT__{index}" data_type: TYPE_FP32 dims: [-1] }} ]
            """)
    http_client, grpc_client = clients(tserve(repo.root))
    x = np.arange(3, dtype=np.float32)
    http_result, _ = kit.infer(http_client, grpc_client, "second", x=x)
    np.testing.assert_array_equal(http_result.as_numpy("OUT__1"), x * 2)
    with pytest.raises(InferenceServerException) as raised:
        kit.infer(http_client, grpc_client, "fourth", x=x)
    assert ("pytorch model 'fourth': output 'OUT__3' refers to forward's result 3, but forward returned 2 "
            "result(s)") in raised.value.message()
