"""Broken models and bad configs fail to load with a reason naming the model and what is wrong; the server
keeps serving the models that are fine."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from triton_serve.plugin import ServerOptions
from triton_serve.testing import RunningServer, free_port

MLP_IO = """
    max_batch_size: 8
    input [{name: "INPUT0", data_type: TYPE_FP32, dims: [4]}]
    output [{name: "OUTPUT0", data_type: TYPE_FP32, dims: [3]}]
"""

# model name -> (model file: "mlp", "random" bytes, None for none; config.pbtxt or None; expected reason part)
BROKEN: dict[str, tuple[str | None, str | None, str]] = {
    "missing_file": (None, 'backend: "onnxruntime"' + MLP_IO,
                     "model 'missing_file': model file '{repo}/missing_file/1/model.onnx' does not exist"),
    "missing_file_to_complete": (None, 'backend: "onnxruntime"',
                                 "failed to load 'missing_file_to_complete': model 'missing_file_to_complete': "
                                 "model file '{repo}/missing_file_to_complete/1/model.onnx' does not exist"),
    "corrupt_file": ("random", 'backend: "onnxruntime"' + MLP_IO,
                     "model 'corrupt_file': ONNX Runtime cannot load '{repo}/corrupt_file/1/model.onnx': "),
    "corrupt_file_to_complete": ("random", None, "failed to load 'corrupt_file_to_complete': model "
                                 "'corrupt_file_to_complete': ONNX Runtime cannot load "
                                 "'{repo}/corrupt_file_to_complete/1/model.onnx': "),
    "unknown_input": ("mlp", 'backend: "onnxruntime"' + MLP_IO.replace('"INPUT0"', '"IMAGE"'),
                      "unexpected inference input 'IMAGE', allowed inputs are: INPUT0"),
    "unknown_output": ("mlp", 'backend: "onnxruntime"' + MLP_IO.replace('"OUTPUT0"', '"SCORES"'),
                       "unexpected inference output 'SCORES', allowed outputs are: OUTPUT0"),
    "wrong_datatype": ("mlp", 'backend: "onnxruntime"' + MLP_IO.replace("TYPE_FP32, dims: [4]",
                                                                          "TYPE_INT32, dims: [4]"),
                       "unable to load model 'wrong_datatype', configuration expects datatype TYPE_INT32 for "
                       "input 'INPUT0', model provides TYPE_FP32"),
    "wrong_dims": ("mlp", 'backend: "onnxruntime"' + MLP_IO.replace("dims: [3]", "dims: [3, 1]"),
                   "model 'wrong_dims', tensor 'OUTPUT0': the model expects 2 dimensions (shape [-1,3]) but the "
                   "model configuration specifies 3 dimensions (an initial batch dimension because max_batch_size > "
                   "0 followed by the explicit tensor shape, making complete shape [-1,3,1])"),
    "variable_dim_for_fixed": ("mlp", 'backend: "onnxruntime"' + MLP_IO.replace("dims: [4]", "dims: [-1]"),
                               "model 'variable_dim_for_fixed', tensor 'INPUT0': the model expects 2 dimensions "
                               "(shape [-1,4]) but the model configuration specifies 2 dimensions (an initial batch "
                               "dimension because max_batch_size > 0 followed by the explicit tensor shape, making "
                               "complete shape [-1,-1])"),
    "no_batch_dimension": ("mlp", 'backend: "onnxruntime"' + MLP_IO.replace("max_batch_size: 8", "").replace(
        "dims: [4]", "dims: [2, 4]").replace("dims: [3]", "dims: [2, 3]"),  # an input's [-1, 4] accepts [2, 4];
        # outputs are compared exactly, as Triton does
        "model 'no_batch_dimension', tensor 'OUTPUT0': the model expects 2 dimensions (shape [-1,3]) but the model "
        "configuration specifies 2 dimensions (shape [2,3])"),
    "input_left_out": ("pair", 'backend: "onnxruntime"\nmax_batch_size: 2\ninput [{name: "IN_INT8", data_type: '
                       'TYPE_INT8, dims: [2]}]\noutput [{name: "OUT_INT8", data_type: TYPE_INT8, dims: [2]}]',
                       "unable to load model 'input_left_out', configuration expects 1 inputs, model provides 2"),
    "batching_a_fixed_model": ("fixed", 'backend: "onnxruntime"\nmax_batch_size: 4',
                               "failed to load 'batching_a_fixed_model': autofill failed for model "
                               "'batching_a_fixed_model': model does not support batching while non-zero "
                               "max_batch_size (4) is specified"),
    "bad_intra_op_thread_count": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'parameters {key: '
                                  '"intra_op_thread_count" value {string_value: "many"}}',
                                  "backend 'onnxruntime': model 'bad_intra_op_thread_count' parameter "
                                  "'intra_op_thread_count' has invalid value 'many': expected an integer >= 0"),
    "negative_inter_op_thread_count": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'parameters {key: '
                                       '"inter_op_thread_count" value {string_value: "-2"}}',
                                       "parameter 'inter_op_thread_count' has invalid value '-2': expected an "
                                       "integer >= 0"),
    "bad_execution_mode": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'parameters {key: "execution_mode" '
                           'value {string_value: "2"}}',
                           "backend 'onnxruntime': model 'bad_execution_mode' parameter 'execution_mode' has "
                           "invalid value '2': expected one of 0, 1"),
    "bad_mem_arena": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'parameters {key: "enable_mem_arena" '
                      'value {string_value: "maybe"}}',
                      "backend 'onnxruntime': model 'bad_mem_arena' parameter 'enable_mem_arena' has invalid value "
                      "'maybe': expected true/false, on/off or 1/0"),
    "bad_arena_shrinkage": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'parameters {key: '
                            '"memory.enable_memory_arena_shrinkage" value {string_value: "disk:0"}}',
                            "parameter 'memory.enable_memory_arena_shrinkage' has invalid value 'disk:0': expected "
                            "devices as 'cpu:0;gpu:0'"),
    "shrinking_a_disabled_arena": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'parameters [{key: "enable_mem_arena" '
                                   'value {string_value: "0"}}, {key: "memory.enable_memory_arena_shrinkage" value '
                                   '{string_value: "cpu:0"}}]',
                                   "model 'shrinking_a_disabled_arena': parameter "
                                   "'memory.enable_memory_arena_shrinkage' names cpu:0, but instance "
                                   "'shrinking_a_disabled_arena_0_0' has no memory arena (enable_mem_arena is off)"),
    "shrinking_a_gpu_arena_on_a_cpu_instance": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'parameters {key: '
                                                '"memory.enable_memory_arena_shrinkage" value {string_value: '
                                                '"cpu:0;gpu:0"}}', "names gpu:0, but instance "
                                                "'shrinking_a_gpu_arena_on_a_cpu_instance_0_0' has memory arenas only "
                                                "for cpu:0"),
    "bad_graph_level": ("mlp", 'backend: "onnxruntime"' + MLP_IO + "optimization {graph {level: 5}}",
                        "model 'bad_graph_level': optimization.graph.level must be -1 (basic), 0 (all), "
                        "1 (extended) or 2 (disabled), got 5"),
    "unknown_cpu_accelerator": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'optimization {execution_accelerators '
                                '{cpu_execution_accelerator [{name: "fpga"}]}}',
                                "model 'unknown_cpu_accelerator': unknown cpu_execution_accelerator 'fpga'; the "
                                "onnxruntime backend knows 'openvino'"),
    "unknown_gpu_accelerator": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'optimization {execution_accelerators '
                                '{gpu_execution_accelerator [{name: "tensorflow"}]}}',
                                "model 'unknown_gpu_accelerator': unknown gpu_execution_accelerator 'tensorflow'; "
                                "the onnxruntime backend knows 'tensorrt' or 'cuda'"),
    "bad_tensorrt_precision": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'optimization {execution_accelerators '
                               '{gpu_execution_accelerator [{name: "tensorrt" parameters {key: "precision_mode" '
                               'value: "FP8"}}]}}',
                               "backend 'onnxruntime': model 'bad_tensorrt_precision' parameter 'precision_mode' of "
                               "execution accelerator 'tensorrt' has invalid value 'FP8': expected one of FP32, FP16, "
                               "BF16, INT8"),
    "unknown_tensorrt_parameter": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'optimization {execution_accelerators'
                                   ' {gpu_execution_accelerator [{name: "tensorrt" parameters {key: "trt_speed" '
                                   'value: "max"}}]}}',
                                   "model 'unknown_tensorrt_parameter': unknown parameter 'trt_speed' of execution "
                                   "accelerator 'tensorrt'"),
    "openvino_not_in_this_build": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'optimization {execution_accelerators'
                                   ' {cpu_execution_accelerator [{name: "openvino"}]}}',
                                   "instance 'openvino_not_in_this_build_0_0' of model 'openvino_not_in_this_build' "
                                   "needs ONNX Runtime's OpenVINOExecutionProvider (cpu_execution_accelerator "
                                   "'openvino'), which this onnxruntime build does not have; available providers: "
                                   + ", ".join(onnxruntime.get_available_providers())),
    # GPU accelerators apply to KIND_GPU instances only; a CPU instance loads without them, as in Triton
    "tensorrt_on_a_cpu_instance": ("mlp", 'backend: "onnxruntime"' + MLP_IO + 'optimization {execution_accelerators'
                                   ' {gpu_execution_accelerator [{name: "tensorrt" parameters {key: "precision_mode" '
                                   'value: "FP16"}}]}}', ""),
    "tuned": ("mlp", 'backend: "onnxruntime"' + MLP_IO + """
        optimization {graph {level: -1}}
        parameters [{key: "intra_op_thread_count" value {string_value: "1"}},
                    {key: "inter_op_thread_count" value {string_value: "1"}},
                    {key: "execution_mode" value {string_value: "1"}},
                    {key: "enable_mem_arena" value {string_value: "true"}},
                    {key: "enable_mem_pattern" value {string_value: "OFF"}},
                    {key: "memory.enable_memory_arena_shrinkage" value {string_value: "cpu:0"}},
                    {key: "some_other_tool_setting" value {string_value: "ignored"}}]
    """, ""),
}


@pytest.fixture(scope="module")
def broken_repository(tmp_path_factory: pytest.TempPathFactory, mlp_model: bytes, kit: Any) -> Iterator[
        tuple[Path, RunningServer]]:
    """One server over a repository holding every BROKEN model."""
    repo = tmp_path_factory.mktemp("repo")
    files = {"mlp": mlp_model, "random": os.urandom(512), "pair": kit.identity_model(["INT8", "FP16"]),
             "fixed": kit.double_model(shape=[2, 3]), None: None}
    for name, (model_file, config, _) in BROKEN.items():
        kit.write_model(repo, name, files[model_file], config)
    server = RunningServer(ServerOptions(
        model_repositories=[str(repo)], http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
        http_address="127.0.0.1", grpc_address="127.0.0.1", metrics_address="127.0.0.1"))
    yield repo, server
    server.stop()


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_load_failures_name_the_model_and_the_problem(name: str, broken_repository: tuple[Path, RunningServer],
                                                      kit: Any) -> None:
    repo, server = broken_repository
    if name == "openvino_not_in_this_build" and "OpenVINOExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime build has the OpenVINO execution provider")
    client = http.InferenceServerClient(server.http_url)
    try:
        expected = BROKEN[name][2].format(repo=repo)
        reason = kit.reasons(client)[name]
        if expected:
            assert expected in reason
            assert not client.is_model_ready(name)
        else:
            assert reason == ""
            x = np.ones((2, 4), dtype=np.float32)
            assert kit.infer(client, name, INPUT0=x).as_numpy("OUTPUT0").shape == (2, 3)
    finally:
        client.close()


def test_explicit_load_of_a_corrupt_model_answers_the_reason(kit: Any, tmp_path: Path, tserve: Any) -> None:
    kit.write_model(tmp_path, "corrupt", b"not an onnx model" * 10, 'backend: "onnxruntime"' + MLP_IO)
    client = http.InferenceServerClient(tserve(tmp_path, model_control_mode="explicit").http_url)
    try:
        with pytest.raises(InferenceServerException,
                           match=f"model 'corrupt': ONNX Runtime cannot load '{tmp_path}/corrupt/1/model.onnx'"):
            client.load_model("corrupt")
    finally:
        client.close()


def test_a_failing_run_answers_the_onnxruntime_error_and_the_model_keeps_serving(kit: Any, tmp_path: Path,
                                                                                 tserve: Any) -> None:
    kit.write_model(tmp_path, "add", kit.add_model(), """
        backend: "onnxruntime"
        input [{name: "X", data_type: TYPE_FP32, dims: [1, -1]}, {name: "Z", data_type: TYPE_FP32, dims: [1, -1]}]
        output [{name: "Y", data_type: TYPE_FP32, dims: [-1, -1]}]
    """)
    client = http.InferenceServerClient(tserve(tmp_path).http_url)
    try:
        with pytest.raises(InferenceServerException, match="ONNX Runtime failed to run model 'add': .*broadcast") \
                as caught:
            kit.infer(client, "add", X=np.ones((1, 2), np.float32), Z=np.ones((1, 3), np.float32))
        assert caught.value.status() == "500"
        got = kit.infer(client, "add", X=np.ones((1, 3), np.float32), Z=np.full((1, 3), 2, np.float32))
        assert got.as_numpy("Y").tolist() == [[3, 3, 3]]
    finally:
        client.close()
