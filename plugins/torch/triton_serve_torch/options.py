"""The model config parameters Triton's PyTorch backend honours, declared for the core's parser."""
from __future__ import annotations

from dataclasses import dataclass

from triton_serve.plugin import option


@dataclass(frozen=True)
class TorchModelOptions:
    """One model's ``parameters { key: "..." value { string_value: "..." } }`` settings, by Triton's keys.

    ``None`` means the config does not set the parameter, so torch's own setting stays.
    """

    disable_optimized_execution: bool = option(False, key="DISABLE_OPTIMIZED_EXECUTION",
                                               doc="run TorchScript without torch.jit.optimized_execution")
    inference_mode: bool = option(True, key="INFERENCE_MODE", doc="run under torch.inference_mode (else no_grad)")
    enable_nvfuser: bool | None = option(None, key="ENABLE_NVFUSER", doc="ignored: PyTorch no longer ships NvFuser")
    enable_weight_sharing: bool | None = option(None, key="ENABLE_WEIGHT_SHARING",
                                                doc="ignored: each instance loads its own copy")
    enable_cache_cleaning: bool = option(False, key="ENABLE_CACHE_CLEANING",
                                         doc="empty the CUDA cache after each execution")
    enable_jit_executor: bool | None = option(None, key="ENABLE_JIT_EXECUTOR", doc="TorchScript's profiling executor")
    enable_jit_profiling: bool | None = option(None, key="ENABLE_JIT_PROFILING", doc="TorchScript's profiling mode")
    enable_tensor_fuser: bool | None = option(None, key="ENABLE_TENSOR_FUSER",
                                              doc="TorchScript's tensor expression fuser")
    intra_op_thread_count: int = option(0, key="INTRA_OP_THREAD_COUNT", minimum=0,
                                        doc="torch's intra-op threads (process-wide); 0 leaves torch's default")
    inter_op_thread_count: int = option(0, key="INTER_OP_THREAD_COUNT", minimum=0,
                                        doc="torch's inter-op threads (process-wide); 0 leaves torch's default")
