"""The model config parameters Triton's PyTorch backend honours, parsed and checked at load."""
from __future__ import annotations

from dataclasses import dataclass

from triton_serve.plugin import ModelConfig, ServerError

_TRUE = ("true", "on", "1")
_FALSE = ("false", "off", "0")


@dataclass(frozen=True)
class TorchModelOptions:
    """One model's ``parameters { key: "..." value { string_value: "..." } }`` settings.

    ``None`` means the config does not set the parameter, so torch's own setting stays.
    """

    disable_optimized_execution: bool = False
    inference_mode: bool = True
    enable_nvfuser: bool | None = None
    enable_weight_sharing: bool | None = None
    enable_cache_cleaning: bool = False
    enable_jit_executor: bool | None = None
    enable_jit_profiling: bool | None = None
    enable_tensor_fuser: bool | None = None
    intra_op_thread_count: int = 0
    inter_op_thread_count: int = 0

    @classmethod
    def from_config(cls, model_name: str, config: ModelConfig) -> TorchModelOptions:
        """Parse the parameters of ``config``; an invalid value raises a ServerError naming it."""
        values = {key: param.string_value for key, param in config.parameters.items()}

        def flag(key: str) -> bool | None:
            if key not in values:
                return None
            text = values[key].strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ServerError(f"pytorch model '{model_name}': parameter {key} must be \"true\" or \"false\", "
                              f"got \"{values[key]}\"")

        def count(key: str) -> int:
            text = values.get(key, "0").strip()
            if not text.isdigit():
                raise ServerError(f"pytorch model '{model_name}': parameter {key} must be a whole number "
                                  f">= 0, got \"{values[key]}\"")
            return int(text)

        def flag_or(key: str, default: bool) -> bool:
            value = flag(key)
            return default if value is None else value

        return cls(
            disable_optimized_execution=flag_or("DISABLE_OPTIMIZED_EXECUTION", False),
            inference_mode=flag_or("INFERENCE_MODE", True),
            enable_nvfuser=flag("ENABLE_NVFUSER"),
            enable_weight_sharing=flag("ENABLE_WEIGHT_SHARING"),
            enable_cache_cleaning=flag_or("ENABLE_CACHE_CLEANING", False),
            enable_jit_executor=flag("ENABLE_JIT_EXECUTOR"),
            enable_jit_profiling=flag("ENABLE_JIT_PROFILING"),
            enable_tensor_fuser=flag("ENABLE_TENSOR_FUSER"),
            intra_op_thread_count=count("INTRA_OP_THREAD_COUNT"),
            inter_op_thread_count=count("INTER_OP_THREAD_COUNT"),
        )
