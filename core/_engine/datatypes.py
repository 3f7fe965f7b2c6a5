"""Tensor datatypes: protocol names, ModelConfig enum names, numpy dtypes and wire encodings."""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .protos.model_config_pb2 import DataType as ConfigDataType


@dataclass(frozen=True)
class TensorType:
    """One tensor datatype as the protocol ("FP32") and ModelConfig ("TYPE_FP32") name it."""

    name: str
    config_name: str
    numpy: np.dtype
    itemsize: int  # bytes per element on the wire; 0 for BYTES (length-prefixed)


_ALL = [
    TensorType("BOOL", "TYPE_BOOL", np.dtype(np.bool_), 1),
    TensorType("UINT8", "TYPE_UINT8", np.dtype("<u1"), 1),
    TensorType("UINT16", "TYPE_UINT16", np.dtype("<u2"), 2),
    TensorType("UINT32", "TYPE_UINT32", np.dtype("<u4"), 4),
    TensorType("UINT64", "TYPE_UINT64", np.dtype("<u8"), 8),
    TensorType("INT8", "TYPE_INT8", np.dtype("<i1"), 1),
    TensorType("INT16", "TYPE_INT16", np.dtype("<i2"), 2),
    TensorType("INT32", "TYPE_INT32", np.dtype("<i4"), 4),
    TensorType("INT64", "TYPE_INT64", np.dtype("<i8"), 8),
    TensorType("FP16", "TYPE_FP16", np.dtype("<f2"), 2),
    TensorType("FP32", "TYPE_FP32", np.dtype("<f4"), 4),
    TensorType("FP64", "TYPE_FP64", np.dtype("<f8"), 8),
    # numpy has no bfloat16: BF16 tensors hold their raw 16-bit patterns as uint16.
    TensorType("BF16", "TYPE_BF16", np.dtype("<u2"), 2),
    TensorType("BYTES", "TYPE_STRING", np.dtype(np.object_), 0),
]

BY_NAME: dict[str, TensorType] = {dt.name: dt for dt in _ALL}
BY_CONFIG_NAME: dict[str, TensorType] = {dt.config_name: dt for dt in _ALL}

_BY_NUMPY_KIND: dict[np.dtype, str] = {
    dt.numpy: dt.name for dt in _ALL if dt.name not in ("BF16", "BYTES")
}


def datatype_of_config(data_type: int) -> TensorType:
    """The TensorType (protocol name, numpy dtype) of a ModelConfig ``TYPE_*`` enum value."""
    return BY_CONFIG_NAME[ConfigDataType.Name(data_type)]


def name_of_config_type(data_type: int) -> str:
    """The protocol name ("FP32") of a ModelConfig ``TensorType`` enum value (TYPE_FP32)."""
    return BY_CONFIG_NAME[ConfigDataType.Name(data_type)].name


def datatype_of(array: np.ndarray) -> str:
    """The protocol datatype name that matches a numpy array's dtype."""
    kind = array.dtype
    if kind.kind in ("O", "S", "U"):
        return "BYTES"
    try:
        return _BY_NUMPY_KIND[kind.newbyteorder("<") if kind.byteorder == ">" else kind]
    except KeyError:
        raise ValueError(f"numpy dtype {kind} has no Triton datatype") from None


MAX_DIMS = 64  # the most dims a tensor may have (numpy's bound on an array's)


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def serialize_bytes(array: np.ndarray) -> bytes:
    """Encode a BYTES tensor as 4-byte little-endian lengths each followed by the bytes."""
    parts: list[bytes] = []
    for item in array.ravel(order="C"):
        data = bytes(item) if isinstance(item, (bytes, bytearray, memoryview)) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


class StringCountError(ValueError):
    """A BYTES tensor holds a different number of elements than its shape needs."""

    def __init__(self, expected: int, found: int) -> None:
        super().__init__(f"expected {expected} BYTES elements, found {found}")
        self.expected = expected
        self.found = found

    def message(self, name: str, model: str) -> str:
        """Triton's words for it (its core's ValidateBytesInputs)."""
        if self.found > self.expected:
            return (f"unexpected number of string elements {self.expected + 1} for inference input '{name}' "
                    f"for model '{model}', expecting {self.expected}")
        return f"expected {self.expected} string elements for inference input '{name}' for model '{model}', " \
               f"got {self.found}"


def check_bytes_elements(buffer: bytes | bytearray | memoryview, count: int) -> None:
    """Check that length-prefixed BYTES elements fill ``buffer`` exactly and number ``count``, without
    decoding them (ValueError, StringCountError for a count)."""
    view = memoryview(buffer)
    unpack = struct.unpack_from
    offset, end, found = 0, len(view), 0
    while offset < end:
        if end - offset < 4:
            raise ValueError("truncated length prefix in BYTES tensor data")
        offset += 4 + unpack("<I", view, offset)[0]
        if offset > end:
            raise ValueError("BYTES element runs past the end of the tensor data")
        found += 1
    if found != count:
        raise StringCountError(count, found)


def deserialize_bytes(buffer: bytes | bytearray | memoryview, count: int | None = None) -> np.ndarray:
    """Decode length-prefixed elements into a 1-D object array of bytes.

    With ``count`` given, exactly that many elements must fill the buffer exactly.
    """
    view = memoryview(buffer)
    items: list[bytes] = []
    offset, end = 0, len(view)
    while offset < end:
        if end - offset < 4:
            raise ValueError("truncated length prefix in BYTES tensor data")
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > end:
            raise ValueError("BYTES element runs past the end of the tensor data")
        items.append(bytes(view[offset:offset + length]))
        offset += length
    if count is not None and len(items) != count:
        raise StringCountError(count, len(items))
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


def to_wire_bytes(datatype: str, array: np.ndarray) -> bytes:
    """The raw little-endian, row-major bytes of a tensor, as binary HTTP and gRPC carry them."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    wire = BY_NAME[datatype].numpy
    if array.dtype != wire:
        array = array.astype(wire)
    return np.ascontiguousarray(array).tobytes()


def from_wire_bytes(datatype: str, shape: tuple[int, ...], buffer: bytes | bytearray | memoryview) -> np.ndarray:
    """Build an array of ``shape`` from raw wire bytes; raise ValueError if the size is wrong."""
    count = element_count(shape)
    if datatype == "BYTES":
        return deserialize_bytes(buffer, count).reshape(shape)
    dt = BY_NAME[datatype]
    expected = count * dt.itemsize
    if len(buffer) != expected:
        raise ValueError(f"expected {expected} bytes, got {len(buffer)}")
    return np.frombuffer(buffer, dtype=dt.numpy).reshape(shape)
