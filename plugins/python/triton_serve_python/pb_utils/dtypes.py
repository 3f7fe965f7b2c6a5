"""Triton datatypes as models see them (numbers, names, numpy types) and the encoding of BYTES tensors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_serve.worker import deserialize_bytes, serialize_bytes

from .errors import TritonModelException


@dataclass(frozen=True)
class TritonType:
    """One datatype: its TRITONSERVER_DataType number (also the ModelConfig enum value) and its names."""

    number: int
    config_name: str  # "TYPE_FP32"
    name: str  # protocol name, "FP32"
    numpy: Any  # numpy scalar type; None for BF16, which numpy lacks
    wire: np.dtype  # how elements sit in memory: little-endian; object for BYTES, uint16 bit patterns for BF16


_TYPES = (
    TritonType(1, "TYPE_BOOL", "BOOL", np.bool_, np.dtype("|b1")),
    TritonType(2, "TYPE_UINT8", "UINT8", np.uint8, np.dtype("<u1")),
    TritonType(3, "TYPE_UINT16", "UINT16", np.uint16, np.dtype("<u2")),
    TritonType(4, "TYPE_UINT32", "UINT32", np.uint32, np.dtype("<u4")),
    TritonType(5, "TYPE_UINT64", "UINT64", np.uint64, np.dtype("<u8")),
    TritonType(6, "TYPE_INT8", "INT8", np.int8, np.dtype("<i1")),
    TritonType(7, "TYPE_INT16", "INT16", np.int16, np.dtype("<i2")),
    TritonType(8, "TYPE_INT32", "INT32", np.int32, np.dtype("<i4")),
    TritonType(9, "TYPE_INT64", "INT64", np.int64, np.dtype("<i8")),
    TritonType(10, "TYPE_FP16", "FP16", np.float16, np.dtype("<f2")),
    TritonType(11, "TYPE_FP32", "FP32", np.float32, np.dtype("<f4")),
    TritonType(12, "TYPE_FP64", "FP64", np.float64, np.dtype("<f8")),
    TritonType(13, "TYPE_STRING", "BYTES", np.object_, np.dtype(np.object_)),
    TritonType(14, "TYPE_BF16", "BF16", None, np.dtype("<u2")),
)
BY_NUMBER = {t.number: t for t in _TYPES}
BY_CONFIG_NAME = {t.config_name: t for t in _TYPES}
BY_NAME = {t.name: t for t in _TYPES}
BY_NUMPY = {np.dtype(t.numpy): t for t in _TYPES if t.numpy is not None and t.name != "BYTES"}  # native dtypes


def type_of_numpy(dtype: Any) -> TritonType | None:
    """The Triton type of a numpy dtype (object, bytes and str arrays are BYTES), or None."""
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "S", "U"):
        return BY_NAME["BYTES"]
    return BY_NUMPY.get(dtype.newbyteorder("=") if dtype.byteorder in "<>" else dtype)


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32`` (None for an unknown name or BF16)."""
    found = BY_CONFIG_NAME.get(triton_type_string)
    return found.numpy if found else None


def triton_to_numpy_type(data_type: int) -> Any:
    """A TRITONSERVER_DataType number -> its numpy type (None for an unknown number or BF16)."""
    found = BY_NUMBER.get(data_type)
    return found.numpy if found else None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """A numpy dtype or type -> its TRITONSERVER_DataType number (None if Triton has no such type)."""
    try:
        found = type_of_numpy(data_type)
    except TypeError:
        return None
    return found.number if found else None


# ---- BYTES tensors ---------------------------------------------------------------------------

# The wire layout is the core's: 4-byte little-endian length, then the bytes (str as UTF-8).
encode_bytes_elements = serialize_bytes
decode_bytes_elements = deserialize_bytes


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray:
    """Encode an object or bytes array as one length-prefixed buffer, returned as a 0-d object array."""
    if input_tensor.dtype.kind not in ("O", "S"):
        raise TritonModelException(f"cannot serialize bytes tensor: invalid datatype {input_tensor.dtype}")
    return np.asarray(encode_bytes_elements(input_tensor), dtype=np.object_)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Decode a length-prefixed buffer into a 1-D object array of bytes."""
    if isinstance(encoded_tensor, np.ndarray):
        encoded_tensor = encoded_tensor.item() if encoded_tensor.dtype.kind == "O" else encoded_tensor.tobytes()
    try:
        return decode_bytes_elements(encoded_tensor)
    except ValueError as error:
        raise TritonModelException(f"cannot deserialize bytes tensor: {error}") from None
