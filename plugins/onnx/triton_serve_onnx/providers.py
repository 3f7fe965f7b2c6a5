"""Which ONNX Runtime execution providers an instance asks for (CPU; CUDA on its GPU; TensorRT and
OpenVINO where the config's execution accelerators name them), and the check that ONNX Runtime really
enabled them: it quietly falls back to the CPU when a provider cannot start."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from triton_serve.plugin import InstanceSpec, ModelConfig, ModelOptimizationPolicy, ServerError, Status, parse_bool

from .parameters import OnnxRuntimeParameters

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
OPENVINO = "OpenVINOExecutionProvider"

Provider = tuple[str, dict[str, str]]
Accelerator = ModelOptimizationPolicy.ExecutionAccelerators.Accelerator


def _as_int(value: str) -> str:
    try:
        return str(int(value))
    except ValueError:
        raise ValueError("expected an integer") from None


def _as_bool(value: str) -> str:
    return "1" if parse_bool(value) else "0"


# TensorRT accelerator parameters Triton accepts -> (TensorRT EP option, value check).
_TENSORRT_OPTIONS: dict[str, tuple[str, Callable[[str], str]]] = {
    "max_workspace_size_bytes": ("trt_max_workspace_size", _as_int),
    "int8_calibration_table_name": ("trt_int8_calibration_table_name", str),
    "int8_use_native_calibration_table": ("trt_int8_use_native_calibration_table", _as_bool),
    **{key: (key, _as_int) for key in (
        "trt_max_partition_iterations", "trt_min_subgraph_size", "trt_dla_core", "trt_builder_optimization_level",
        "trt_auxiliary_streams", "trt_ep_context_embed_mode")},
    **{key: (key, _as_bool) for key in (
        "trt_dla_enable", "trt_engine_cache_enable", "trt_dump_subgraphs", "trt_force_sequential_engine_build",
        "trt_context_memory_sharing_enable", "trt_layer_norm_fp32_fallback", "trt_timing_cache_enable",
        "trt_force_timing_cache", "trt_detailed_build_log", "trt_build_heuristics_enable", "trt_sparsity_enable",
        "trt_cuda_graph_enable", "trt_dump_ep_context_model")},
    **{key: (key, str) for key in (
        "trt_engine_cache_path", "trt_engine_cache_prefix", "trt_timing_cache_path", "trt_tactic_sources",
        "trt_extra_plugin_lib_paths", "trt_profile_min_shapes", "trt_profile_max_shapes",
        "trt_profile_opt_shapes", "trt_ep_context_file_path")},
}
_PRECISION_MODES = {"FP32": None, "FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable"}

# CUDA EP option values for the numbers Triton's older CUDA model parameters hold.
_CUDNN_SEARCH = {0: "EXHAUSTIVE", 1: "HEURISTIC", 2: "DEFAULT"}
_ARENA_STRATEGY = {0: "kNextPowerOfTwo", 1: "kSameAsRequested"}


def choose_providers(config: ModelConfig, parameters: OnnxRuntimeParameters, instance: InstanceSpec, model_name: str,
                     available: Sequence[str]) -> list[Provider]:
    """The providers, in priority order, for one instance; raise a ServerError naming the model, instance and
    accelerator when the config asks for one this onnxruntime build lacks or names one that does not exist.

    GPU accelerators apply to KIND_GPU instances only (as in Triton), but are checked for every kind."""
    gpu_providers = _gpu_providers(config, parameters, instance, model_name)
    providers = gpu_providers if instance.kind == "GPU" else []
    for accelerator in config.optimization.execution_accelerators.cpu_execution_accelerator:
        if accelerator.name != "openvino":
            raise _unknown_accelerator("cpu", accelerator.name, model_name)
        providers.append((OPENVINO, {"device_type": "CPU"}))
    providers.append((CPU, {}))
    for name, _ in providers:
        if name not in available:
            raise ServerError(f"instance '{instance.name}' of model '{model_name}' needs ONNX Runtime's {name} "
                              f"({_why(name)}), which this onnxruntime build does not have; available providers: "
                              f"{', '.join(available)}", Status.UNAVAILABLE)
    return providers


def _gpu_providers(config: ModelConfig, parameters: OnnxRuntimeParameters, instance: InstanceSpec,
                   model_name: str) -> list[Provider]:
    """TensorRT where asked, then CUDA on the instance's GPU."""
    device = {"device_id": str(instance.device_id)}
    providers: list[Provider] = []
    cuda_options = {**device, **_legacy_cuda_options(parameters)}
    for accelerator in config.optimization.execution_accelerators.gpu_execution_accelerator:
        if accelerator.name == "tensorrt":
            providers.append((TENSORRT, {**device, **_tensorrt_options(accelerator, model_name)}))
        elif accelerator.name == "cuda":
            cuda_options.update(_cuda_options(accelerator, model_name))
        else:
            raise _unknown_accelerator("gpu", accelerator.name, model_name)
    providers.append((CUDA, cuda_options))
    return providers


def check_enabled(session: Any, providers: Sequence[Provider], instance: InstanceSpec, model_name: str) -> None:
    """Fail when ONNX Runtime started the session without a provider it was asked for."""
    enabled = session.get_providers()
    for name, options in providers:
        if name not in enabled:
            device = f" on GPU {options['device_id']}" if "device_id" in options else ""
            raise ServerError(
                f"instance '{instance.name}' of model '{model_name}' needs ONNX Runtime's {name} ({_why(name)}), "
                f"but it could not start{device} and ONNX Runtime fell back to {', '.join(enabled)}; check that "
                f"{_NEEDS.get(name, 'its libraries')} are present", Status.UNAVAILABLE)


_NEEDS = {CUDA: "the GPU and the CUDA and cuDNN libraries onnxruntime-gpu was built for",
          TENSORRT: "the GPU and the TensorRT, CUDA and cuDNN libraries onnxruntime-gpu was built for",
          OPENVINO: "the OpenVINO libraries"}


def _why(provider: str) -> str:
    return {CUDA: "the instance is KIND_GPU", TENSORRT: "gpu_execution_accelerator 'tensorrt'",
            OPENVINO: "cpu_execution_accelerator 'openvino'"}.get(provider, "the default")


def _unknown_accelerator(kind: str, name: str, model_name: str) -> ServerError:
    known = "'tensorrt' or 'cuda'" if kind == "gpu" else "'openvino'"
    return ServerError(f"model '{model_name}': unknown {kind}_execution_accelerator '{name}'; the onnxruntime "
                       f"backend knows {known}")


def _tensorrt_options(accelerator: Accelerator, model_name: str) -> dict[str, str]:
    options = {}
    for key, value in accelerator.parameters.items():
        if key == "precision_mode":
            if value not in _PRECISION_MODES:
                raise _invalid(model_name, "tensorrt", key, value, "expected one of " + ", ".join(_PRECISION_MODES))
            option = _PRECISION_MODES[value]
            if option:
                options[option] = "1"
            continue
        if key not in _TENSORRT_OPTIONS:
            raise ServerError(f"model '{model_name}': unknown parameter '{key}' of execution accelerator 'tensorrt'")
        option, check = _TENSORRT_OPTIONS[key]
        try:
            options[option] = check(value)
        except ValueError as error:
            raise _invalid(model_name, "tensorrt", key, value, str(error)) from None
    return options


def _cuda_options(accelerator: Accelerator, model_name: str) -> dict[str, str]:
    options = dict(accelerator.parameters)
    for key in ("do_copy_in_default_stream", "use_ep_level_unified_stream"):
        if key in options:
            try:
                options[key] = _as_bool(options[key])
            except ValueError as error:
                raise _invalid(model_name, "cuda", key, options[key], str(error)) from None
    return options


def _invalid(model_name: str, accelerator: str, key: str, value: str, reason: str) -> ServerError:
    """The core's error format for options, for an execution accelerator's parameter."""
    return ServerError(f"backend 'onnxruntime': model '{model_name}' parameter '{key}' of execution accelerator "
                       f"'{accelerator}' has invalid value '{value}': {reason}")


def _legacy_cuda_options(parameters: OnnxRuntimeParameters) -> dict[str, str]:
    """CUDA provider options from Triton's older model parameters."""
    options = {}
    if parameters.cudnn_conv_algo_search is not None:
        options["cudnn_conv_algo_search"] = _CUDNN_SEARCH[parameters.cudnn_conv_algo_search]
    if parameters.arena_extend_strategy is not None:
        options["arena_extend_strategy"] = _ARENA_STRATEGY[parameters.arena_extend_strategy]
    if parameters.gpu_mem_limit is not None:
        options["gpu_mem_limit"] = str(parameters.gpu_mem_limit)
    if parameters.do_copy_in_default_stream is not None:
        options["do_copy_in_default_stream"] = "1" if parameters.do_copy_in_default_stream else "0"
    return options
