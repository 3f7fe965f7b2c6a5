"""Tensors between the server and ONNX Runtime: datatype names, BYTES as text, BF16 as raw 16-bit patterns."""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from triton_serve.plugin import ServerError, Status

# ONNX Runtime's type strings (NodeArg.type) -> ModelConfig datatype names.
CONFIG_TYPE_OF_ORT: dict[str, str] = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(bfloat16)": "TYPE_BF16",
    "tensor(string)": "TYPE_STRING",
}

ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16, the element type ONNX Runtime wants for BF16 OrtValues


def text_input(array: np.ndarray, input_name: str, model_name: str) -> np.ndarray:
    """A BYTES input (object array of bytes) as the object array of str that ONNX Runtime string tensors take.

    ONNX Runtime's Python API moves strings as UTF-8 text, so other bytes cannot reach the model.
    """
    result = np.empty(array.shape, dtype=np.object_)
    flat = result.reshape(-1)
    for index, value in enumerate(array.reshape(-1)):
        try:
            flat[index] = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError:
            raise ServerError(f"input '{input_name}' of model '{model_name}' holds bytes that are not UTF-8 "
                              f"(element {index}); ONNX Runtime string tensors take UTF-8 text") from None
    return result


def bf16_input(array: np.ndarray) -> Any:
    """A BF16 input (uint16 bit patterns) as an OrtValue of element type bfloat16."""
    import onnxruntime

    return onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(array),
                                                                   onnx_element_type=ONNX_BFLOAT16)


def ortvalue_as_array(value: Any) -> np.ndarray:
    """An output OrtValue as numpy; bfloat16 (which numpy lacks) becomes a uint16 array of its bit patterns."""
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
    return np.frombuffer(raw, dtype=np.uint16).reshape(value.shape())


def unsupported_type(kind: str, name: str, ort_type: str, model_name: str) -> ServerError:
    return ServerError(f"model '{model_name}': ONNX {kind} '{name}' has type {ort_type}, which has no Triton "
                       "datatype", Status.UNSUPPORTED)
