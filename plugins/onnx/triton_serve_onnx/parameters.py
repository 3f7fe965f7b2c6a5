"""The model ``parameters`` Triton's onnxruntime backend reads, declared for the core's parser, and the ONNX
Runtime session and run options they and ``optimization.graph`` make."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from triton_serve.plugin import InstanceSpec, ModelConfig, ServerError, option

ARENA_SHRINKAGE = "memory.enable_memory_arena_shrinkage"
DEVICE_ALLOCATOR_FOR_INITIALIZERS = "session.use_device_allocator_for_initializers"


def _arena_list(value: str) -> None:
    for device in value.split(";"):
        kind, _, index = device.partition(":")
        if kind not in ("cpu", "gpu") or not index.isdigit():
            raise ValueError("expected devices as 'cpu:0;gpu:0'")


@dataclass(frozen=True)
class OnnxRuntimeParameters:
    """A model's ``parameters { key: ... value { string_value: ... } }``, by Triton's keys. ``None``: not set,
    ONNX Runtime's own default applies."""

    intra_op_thread_count: int = option(0, key="intra_op_thread_count", minimum=0,
                                        doc="threads inside one operator; 0 lets ONNX Runtime choose")
    inter_op_thread_count: int = option(0, key="inter_op_thread_count", minimum=0,
                                        doc="threads running operators at once (execution_mode 1); 0 lets ONNX "
                                            "Runtime choose")
    execution_mode: Literal[0, 1] = option(0, key="execution_mode", doc="0 runs operators one at a time, 1 in parallel")
    enable_mem_arena: bool | None = option(None, key="enable_mem_arena", doc="the CPU memory arena")
    enable_mem_pattern: bool | None = option(None, key="enable_mem_pattern", doc="memory pattern optimization")
    arena_shrinkage: str | None = option(None, key=ARENA_SHRINKAGE, check=_arena_list,
                                         doc="the memory arenas to shrink after each run, e.g. 'cpu:0;gpu:0'")
    device_allocator_for_initializers: bool | None = option(
        None, key=DEVICE_ALLOCATOR_FOR_INITIALIZERS, doc="allocate initializers with the device allocator")
    cudnn_conv_algo_search: Literal[0, 1, 2] | None = option(
        None, key="cudnn_conv_algo_search", doc="CUDA: cuDNN convolution search, 0 exhaustive, 1 heuristic, 2 default")
    gpu_mem_limit: int | None = option(None, key="gpu_mem_limit", minimum=1, doc="CUDA: the arena's limit in bytes")
    arena_extend_strategy: Literal[0, 1] | None = option(
        None, key="arena_extend_strategy", doc="CUDA: the arena grows to the next power of two (0) or as asked (1)")
    do_copy_in_default_stream: bool | None = option(None, key="do_copy_in_default_stream",
                                                    doc="CUDA: copy on the default stream")


def session_options(parameters: OnnxRuntimeParameters, config: ModelConfig, model_name: str) -> Any:
    """An ``onnxruntime.SessionOptions`` from the parameters and the config's graph optimization level."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = _graph_optimization_level(config, model_name)
    options.execution_mode = (onnxruntime.ExecutionMode.ORT_PARALLEL if parameters.execution_mode
                              else onnxruntime.ExecutionMode.ORT_SEQUENTIAL)
    if parameters.intra_op_thread_count > 0:
        options.intra_op_num_threads = parameters.intra_op_thread_count
    if parameters.inter_op_thread_count > 0:
        options.inter_op_num_threads = parameters.inter_op_thread_count
    if parameters.enable_mem_arena is not None:
        options.enable_cpu_mem_arena = parameters.enable_mem_arena
    if parameters.enable_mem_pattern is not None:
        options.enable_mem_pattern = parameters.enable_mem_pattern
    if parameters.device_allocator_for_initializers is not None:
        options.add_session_config_entry(DEVICE_ALLOCATOR_FOR_INITIALIZERS,
                                         "1" if parameters.device_allocator_for_initializers else "0")
    return options


def run_options(parameters: OnnxRuntimeParameters, model_name: str, instance: InstanceSpec) -> Any:
    """An ``onnxruntime.RunOptions`` for every run of one instance: the memory arenas to shrink after each
    run when the config asks; each must be an arena the instance has."""
    import onnxruntime

    options = onnxruntime.RunOptions()
    value = parameters.arena_shrinkage
    if value is None:
        return options
    arenas = ["cpu:0"] if parameters.enable_mem_arena is not False else []
    if instance.kind == "GPU":
        arenas.append(f"gpu:{instance.device_id}")
    for device in value.split(";"):
        if device not in arenas:
            has = (f"memory arenas only for {', '.join(arenas)}" if arenas
                   else "no memory arena (enable_mem_arena is off)")
            raise ServerError(f"model '{model_name}': parameter '{ARENA_SHRINKAGE}' names {device}, but instance "
                              f"'{instance.name}' has {has}")
    options.add_run_config_entry(ARENA_SHRINKAGE, value)
    return options


def _graph_optimization_level(config: ModelConfig, model_name: str) -> Any:
    """Triton's ``optimization { graph { level } }``: 0 (or unset) all, -1 basic, 1 extended, 2 none."""
    import onnxruntime

    levels = onnxruntime.GraphOptimizationLevel
    by_level = {0: levels.ORT_ENABLE_ALL, -1: levels.ORT_ENABLE_BASIC, 1: levels.ORT_ENABLE_EXTENDED,
                2: levels.ORT_DISABLE_ALL}
    level = config.optimization.graph.level
    if level not in by_level:
        raise ServerError(f"model '{model_name}': optimization.graph.level must be -1 (basic), 0 (all), "
                          f"1 (extended) or 2 (disabled), got {level}")
    return by_level[level]
