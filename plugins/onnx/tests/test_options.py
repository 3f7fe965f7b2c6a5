"""Model parameters, graph levels and execution accelerators reach the ONNX Runtime session as Triton maps them."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import onnxruntime
import pytest
from google.protobuf import text_format

from triton_serve.plugin import (AutoCompleteOptions, InstanceSpec, ModelConfig, ModelInstanceGroup, ModelSpec,
                                 ServerError, Status, model_parameters)
from triton_serve_onnx.backend import OnnxRuntimeBackend
from triton_serve_onnx.parameters import OnnxRuntimeParameters
from triton_serve_onnx.providers import choose_providers
from triton_serve_onnx.session import open_instance_session

LEVELS = onnxruntime.GraphOptimizationLevel


def _model(version_dir: Path, config_text: str) -> ModelSpec:
    config = text_format.Parse('max_batch_size: 8\ninput [{name: "X", data_type: TYPE_FP32, dims: [-1]}]\n'
                               'output [{name: "Y", data_type: TYPE_FP32, dims: [-1]}]\n' + config_text, ModelConfig())
    spec = ModelSpec(version_dir.parent.name, 1, config, version_dir.parent, version_dir, "model.onnx")
    spec.parameters = model_parameters(OnnxRuntimeBackend(), spec)  # as the core does
    return spec


def _instance(kind: str = "CPU", device_id: int = 0) -> InstanceSpec:
    return InstanceSpec("m_0_0", ModelInstanceGroup(), 0, kind, device_id)


@pytest.mark.parametrize(("level", "expected"), [(None, LEVELS.ORT_ENABLE_ALL), (0, LEVELS.ORT_ENABLE_ALL),
                                                 (-1, LEVELS.ORT_ENABLE_BASIC), (1, LEVELS.ORT_ENABLE_EXTENDED),
                                                 (2, LEVELS.ORT_DISABLE_ALL)])
def test_graph_level_maps_as_in_triton(kit: Any, tmp_path: Path, level: int | None, expected: Any) -> None:
    version_dir = kit.write_model(tmp_path, "m", kit.double_model())
    graph = "" if level is None else f"optimization {{graph {{level: {level}}}}}"
    runner = open_instance_session(_model(version_dir, graph), _instance())
    assert runner.session.get_session_options().graph_optimization_level == expected


def test_session_parameters_are_applied(kit: Any, tmp_path: Path) -> None:
    version_dir = kit.write_model(tmp_path, "m", kit.double_model())
    runner = open_instance_session(_model(version_dir, """
        parameters [{key: "intra_op_thread_count" value {string_value: "1"}},
                    {key: "inter_op_thread_count" value {string_value: "2"}},
                    {key: "execution_mode" value {string_value: "1"}},
                    {key: "enable_mem_arena" value {string_value: "false"}},
                    {key: "enable_mem_pattern" value {string_value: "0"}},
                    {key: "session.use_device_allocator_for_initializers" value {string_value: "on"}}]
    """), _instance())
    options = runner.session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 2)
    assert options.execution_mode == onnxruntime.ExecutionMode.ORT_PARALLEL
    assert (options.enable_cpu_mem_arena, options.enable_mem_pattern) == (False, False)
    assert options.get_session_config_entry("session.use_device_allocator_for_initializers") == "1"
    assert runner.session.get_providers() == ["CPUExecutionProvider"]


def test_defaults_leave_onnxruntime_to_choose(kit: Any, tmp_path: Path) -> None:
    version_dir = kit.write_model(tmp_path, "m", kit.double_model())
    options = open_instance_session(_model(version_dir, ""), _instance()).session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (0, 0)
    assert options.execution_mode == onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    assert (options.enable_cpu_mem_arena, options.enable_mem_pattern) == (True, True)


def test_gpu_instances_ask_for_tensorrt_then_cuda_on_their_device() -> None:
    config = text_format.Parse("""
        parameters [{key: "cudnn_conv_algo_search" value {string_value: "1"}},
                    {key: "gpu_mem_limit" value {string_value: "1073741824"}}]
        optimization {execution_accelerators {
            gpu_execution_accelerator [
                {name: "tensorrt" parameters [{key: "precision_mode" value: "FP16"},
                                              {key: "max_workspace_size_bytes" value: "1073741824"},
                                              {key: "trt_engine_cache_enable" value: "true"},
                                              {key: "trt_engine_cache_path" value: "/tmp/engines"}]},
                {name: "cuda" parameters [{key: "use_ep_level_unified_stream" value: "on"}]}]
            cpu_execution_accelerator [{name: "openvino"}]}}
    """, ModelConfig())
    available = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "OpenVINOExecutionProvider",
                 "CPUExecutionProvider"]
    parameters = OnnxRuntimeParameters(cudnn_conv_algo_search=1, gpu_mem_limit=1 << 30)
    assert choose_providers(config, parameters, _instance("GPU", 3), "m", available) == [
        ("TensorrtExecutionProvider", {"device_id": "3", "trt_fp16_enable": "1", "trt_max_workspace_size": "1073741824",
                                       "trt_engine_cache_enable": "1", "trt_engine_cache_path": "/tmp/engines"}),
        ("CUDAExecutionProvider", {"device_id": "3", "cudnn_conv_algo_search": "HEURISTIC",
                                   "gpu_mem_limit": "1073741824", "use_ep_level_unified_stream": "1"}),
        ("OpenVINOExecutionProvider", {"device_type": "CPU"}),
        ("CPUExecutionProvider", {}),
    ]
    assert choose_providers(config, parameters, _instance("CPU"), "m", available) == [
        ("OpenVINOExecutionProvider", {"device_type": "CPU"}), ("CPUExecutionProvider", {})]


def test_a_gpu_instance_without_the_cuda_provider_is_a_clear_error() -> None:
    with pytest.raises(ServerError) as caught:
        choose_providers(ModelConfig(), OnnxRuntimeParameters(), _instance("GPU"), "m", ["CPUExecutionProvider"])
    assert caught.value.status is Status.UNAVAILABLE
    assert caught.value.message == ("instance 'm_0_0' of model 'm' needs ONNX Runtime's CUDAExecutionProvider (the "
                                    "instance is KIND_GPU), which this onnxruntime build does not have; available "
                                    "providers: CPUExecutionProvider")


@pytest.mark.parametrize(("parameter", "value", "message"), [
    ("trt_engine_cache_enable", "yes please", "backend 'onnxruntime': model 'm' parameter 'trt_engine_cache_enable' "
                                              "of execution accelerator 'tensorrt' has invalid value 'yes please': "
                                              "expected true/false, on/off or 1/0"),
    ("trt_min_subgraph_size", "1.5", "backend 'onnxruntime': model 'm' parameter 'trt_min_subgraph_size' of execution "
                                     "accelerator 'tensorrt' has invalid value '1.5': expected an integer"),
], ids=["bool", "int"])
def test_bad_tensorrt_values_name_the_parameter(parameter: str, value: str, message: str) -> None:
    config = text_format.Parse(f'optimization {{execution_accelerators {{gpu_execution_accelerator [{{name: '
                               f'"tensorrt" parameters {{key: "{parameter}" value: "{value}"}}}}]}}}}', ModelConfig())
    with pytest.raises(ServerError, match=re.escape(message)):
        choose_providers(config, OnnxRuntimeParameters(), _instance("GPU"), "m",
                         ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])


def test_unavailable_reason_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    assert OnnxRuntimeBackend().unavailable_reason() is None
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes "import onnxruntime" raise ImportError
    reason = OnnxRuntimeBackend().unavailable_reason()
    assert reason is not None and reason.startswith("onnxruntime cannot be imported (")
    assert reason.endswith("; pip install 'triton-serve-onnx[cpu]' (or [gpu] for CUDA)")


def test_the_legacy_cuda_parameters_are_declared_with_their_values() -> None:
    config = text_format.Parse('parameters [{key: "arena_extend_strategy" value {string_value: "1"}}, '
                               '{key: "do_copy_in_default_stream" value {string_value: "OFF"}}]', ModelConfig())
    spec = ModelSpec("m", 1, config, Path("m"), Path("m/1"))
    parameters = model_parameters(OnnxRuntimeBackend(), spec)
    assert (parameters.arena_extend_strategy, parameters.do_copy_in_default_stream) == (1, False)
    cuda = choose_providers(config, parameters, _instance("GPU"), "m",
                            ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert cuda[0] == ("CUDAExecutionProvider", {"device_id": "0", "arena_extend_strategy": "kSameAsRequested",
                                                 "do_copy_in_default_stream": "0"})


def test_a_bad_default_max_batch_size_option_fails_the_load(kit: Any, tmp_path: Path, tserve: Any,
                                                            clients: Any) -> None:
    kit.write_model(tmp_path, "double", kit.double_model())
    http_client, _ = clients(tserve(tmp_path, backend_config={"onnxruntime": {"default-max-batch-size": "lots"}}))
    index = {entry["name"]: entry for entry in http_client.get_model_repository_index()}
    assert index["double"]["reason"] == ("failed to load 'double': backend 'onnxruntime': --backend-config option "
                                         "'default-max-batch-size' has invalid value 'lots': expected an integer >= 0")
    assert OnnxRuntimeBackend(AutoCompleteOptions(default_max_batch_size=2)).options.default_max_batch_size == 2
