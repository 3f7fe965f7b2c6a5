"""Tensor datatypes between model config types, numpy arrays and torch tensors."""
from __future__ import annotations

import numpy as np
import torch

from triton_serve.plugin import DataType

# torch < 2.3 has no uint16/uint32/uint64; where it has them, few operators accept them.
_UNSIGNED = {f"TYPE_UINT{bits}": getattr(torch, f"uint{bits}") for bits in (16, 32, 64)
             if hasattr(torch, f"uint{bits}")}

TORCH_DTYPES: dict[str, torch.dtype] = {
    "TYPE_BOOL": torch.bool,
    "TYPE_UINT8": torch.uint8,
    **_UNSIGNED,
    "TYPE_INT8": torch.int8,
    "TYPE_INT16": torch.int16,
    "TYPE_INT32": torch.int32,
    "TYPE_INT64": torch.int64,
    "TYPE_FP16": torch.float16,
    "TYPE_FP32": torch.float32,
    "TYPE_FP64": torch.float64,
    "TYPE_BF16": torch.bfloat16,
}
CONFIG_TYPES: dict[torch.dtype, str] = {dtype: name for name, dtype in TORCH_DTYPES.items()}


def torch_dtype(data_type: int) -> torch.dtype | None:
    """The torch dtype of a ModelConfig ``TYPE_*`` value, or None when torch tensors cannot hold it (BYTES)."""
    return TORCH_DTYPES.get(DataType.Name(data_type))


def to_tensor(array: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of ``dtype`` on ``device`` holding ``array`` (BF16 arrays carry uint16 bit patterns)."""
    array = np.ascontiguousarray(array)
    if not array.flags.writeable:  # torch tensors cannot be read-only; wire buffers are
        array = array.copy()
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(array).to(device)


def to_array(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array on the CPU (BF16 as its uint16 bit patterns)."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()
