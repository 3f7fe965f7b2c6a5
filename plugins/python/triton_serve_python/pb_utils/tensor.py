"""pb_utils.Tensor: a named numpy array that models receive as input and return as output."""
from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import BY_NUMPY, TritonType, type_of_numpy
from .errors import TritonModelException

_DLPACK_CPU = (1, 0)  # (kDLCPU, device 0)


class _Capsule:
    """Lets numpy import a bare DLPack capsule, which it only accepts through ``__dlpack__``."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return _DLPACK_CPU


class Tensor:
    """A named tensor in CPU memory, backed by a numpy array (an object array of bytes for BYTES).

    Inputs a model receives are views of the request's shared memory, valid during ``execute``.
    """

    __slots__ = ("_name", "_array", "_type")

    def __init__(self, name: str, array: np.ndarray) -> None:
        if not isinstance(name, str):
            raise TritonModelException(f"tensor name must be a str, got {type(name).__name__}")
        if not isinstance(array, np.ndarray):
            raise TritonModelException(f"tensor '{name}' needs a numpy array, got {type(array).__name__}")
        # a native dtype is found with one dict lookup; type_of_numpy handles the rest (byte order, BYTES)
        found = BY_NUMPY.get(array.dtype) or type_of_numpy(array.dtype)
        if found is None:
            raise TritonModelException(f"tensor '{name}' has numpy dtype {array.dtype}, which has no Triton datatype")
        self._name = name
        self._array = array
        self._type: TritonType = found

    @classmethod
    def _typed(cls, name: str, array: np.ndarray, triton_type: TritonType) -> Tensor:
        """A tensor whose datatype is given rather than inferred (BF16 arrives as uint16 bit patterns)."""
        tensor = cls.__new__(cls)
        tensor._name, tensor._array, tensor._type = name, array, triton_type
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        """The TRITONSERVER_DataType number (TYPE_FP32 is 11)."""
        return self._type.number

    @property
    def datatype(self) -> str:
        """The protocol datatype name ("FP32", "BYTES")."""
        return self._type.name

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    # ---- DLPack --------------------------------------------------------------------------------

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing this tensor's memory (not for BYTES tensors)."""
        self._check_dlpack()
        return self._array.__dlpack__()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        self._check_dlpack()
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return _DLPACK_CPU

    def _check_dlpack(self) -> None:
        if self._type.name == "BYTES":
            raise TritonModelException(f"tensor '{self._name}' holds BYTES, which DLPack cannot carry")

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> Tensor:
        """A tensor sharing the memory of a DLPack capsule or of an object with ``__dlpack__`` (CPU only)."""
        source = dlpack if hasattr(dlpack, "__dlpack__") else _Capsule(dlpack)
        try:
            array = np.from_dlpack(source)
        except (BufferError, TypeError, ValueError, RuntimeError) as error:
            raise TritonModelException(f"cannot make tensor '{name}' from DLPack (only CPU memory is "
                                       f"supported): {error}") from None
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._type.name}, shape={list(self._array.shape)})"
