"""Model ``parameters`` and ``optimization.graph`` as ONNX Runtime session and run options, read the way
Triton's onnxruntime backend reads them."""
from __future__ import annotations

from typing import Any

from triton_serve.plugin import InstanceSpec, ModelConfig, ServerError

ARENA_SHRINKAGE = "memory.enable_memory_arena_shrinkage"
DEVICE_ALLOCATOR_FOR_INITIALIZERS = "session.use_device_allocator_for_initializers"

_TRUE = ("true", "on", "1")
_FALSE = ("false", "off", "0")


def session_options(config: ModelConfig, model_name: str) -> Any:
    """An ``onnxruntime.SessionOptions`` from the config; a bad value raises a ServerError naming it."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = _graph_optimization_level(config, model_name)
    parallel = int_parameter(config, "execution_mode", model_name, default=0, allowed=(0, 1))
    options.execution_mode = (onnxruntime.ExecutionMode.ORT_PARALLEL if parallel
                              else onnxruntime.ExecutionMode.ORT_SEQUENTIAL)
    intra = int_parameter(config, "intra_op_thread_count", model_name, default=0, minimum=0)
    if intra > 0:
        options.intra_op_num_threads = intra
    inter = int_parameter(config, "inter_op_thread_count", model_name, default=0, minimum=0)
    if inter > 0:
        options.inter_op_num_threads = inter
    arena = bool_parameter(config, "enable_mem_arena", model_name)
    if arena is not None:
        options.enable_cpu_mem_arena = arena
    pattern = bool_parameter(config, "enable_mem_pattern", model_name)
    if pattern is not None:
        options.enable_mem_pattern = pattern
    on_device = bool_parameter(config, DEVICE_ALLOCATOR_FOR_INITIALIZERS, model_name)
    if on_device is not None:
        options.add_session_config_entry(DEVICE_ALLOCATOR_FOR_INITIALIZERS, "1" if on_device else "0")
    return options


def run_options(config: ModelConfig, model_name: str, instance: InstanceSpec) -> Any:
    """An ``onnxruntime.RunOptions`` for every run of one instance: the memory arenas to shrink after each
    run ("cpu:0;gpu:0") when the config asks; each must be an arena the instance has."""
    import onnxruntime

    options = onnxruntime.RunOptions()
    value = string_parameter(config, ARENA_SHRINKAGE)
    if value is None:
        return options
    arenas = ["cpu:0"] if bool_parameter(config, "enable_mem_arena", model_name) is not False else []
    if instance.kind == "GPU":
        arenas.append(f"gpu:{instance.device_id}")
    for device in value.split(";"):
        kind, _, index = device.partition(":")
        if kind not in ("cpu", "gpu") or not index.isdigit():
            raise ServerError(f"model '{model_name}': parameter '{ARENA_SHRINKAGE}' must list devices as "
                              f"'cpu:0;gpu:0', got '{value}'")
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


def string_parameter(config: ModelConfig, key: str) -> str | None:
    """A model parameter's ``string_value``, or None when the config does not set it."""
    return config.parameters[key].string_value if key in config.parameters else None


def int_parameter(config: ModelConfig, key: str, model_name: str, *, default: int, minimum: int | None = None,
                  allowed: tuple[int, ...] = ()) -> int:
    value = string_parameter(config, key)
    if value is None:
        return default
    try:
        number = int(value.strip())
    except ValueError:
        number = None
    if number is None or (minimum is not None and number < minimum) or (allowed and number not in allowed):
        wanted = (" or ".join(map(str, allowed)) if allowed
                  else f"an integer >= {minimum}" if minimum is not None else "an integer")
        raise ServerError(f"model '{model_name}': parameter '{key}' must be {wanted}, got '{value}'")
    return number


def bool_parameter(config: ModelConfig, key: str, model_name: str) -> bool | None:
    value = string_parameter(config, key)
    return None if value is None else parse_bool(value, f"parameter '{key}'", model_name)


def bool_from_string(value: str) -> bool | None:
    """Triton's boolean strings: true/on/1 and false/off/0, in any case; None for anything else."""
    lowered = value.strip().lower()
    return True if lowered in _TRUE else False if lowered in _FALSE else None


def parse_bool(value: str, what: str, model_name: str) -> bool:
    flag = bool_from_string(value)
    if flag is None:
        raise ServerError(f"model '{model_name}': {what} must be true/false (or 1/0, on/off), got '{value}'")
    return flag
