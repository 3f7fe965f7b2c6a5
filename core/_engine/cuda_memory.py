"""CUDA shared-memory regions: a client's cudaIpc handle opened with cuda-python (the optional ``cuda``
extra), imported only when a client registers one. Each read or write is one device copy."""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .errors import ServerError, Status
from .shared_memory import CUDA, Region

IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)


def _cuda() -> tuple[Any, Any]:
    """cuda-python's runtime and driver modules; ImportError without cuda-python."""
    try:
        from cuda.bindings import driver, runtime
    except ImportError:
        from cuda import cuda as driver, cudart as runtime  # cuda-python before 12.6
    return runtime, driver


def _ok(result: tuple[Any, ...]) -> Any:
    """The value of a cuda-python call (a tuple of error code and results); RuntimeError on failure."""
    error, *values = result
    if int(error) != 0:
        raise RuntimeError(getattr(error, "name", str(error)))
    return values[0] if len(values) == 1 else tuple(values)


class CudaRegion(Region):
    """GPU memory another process exported with cudaIpcGetMemHandle, opened on ``device_id``."""

    kind = CUDA

    def __init__(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        super().__init__(name, byte_size)
        self.device_id = device_id
        if len(raw_handle) != IPC_HANDLE_SIZE or byte_size <= 0:  # invalid whether or not a GPU is here
            raise self._invalid(f"a {len(raw_handle)}-byte handle (a cudaIpcMemHandle_t has {IPC_HANDLE_SIZE}), "
                                f"byte_size {byte_size}")
        try:
            self._runtime, driver = _cuda()
        except ImportError:
            raise self._unsupported("cuda-python is not installed (pip install 'triton-serve[cuda]')") from None
        runtime = self._runtime
        try:
            count = _ok(runtime.cudaGetDeviceCount())
        except RuntimeError as error:
            raise self._unsupported(f"no usable CUDA device: {error}") from None
        if not 0 <= device_id < count:
            raise self._invalid(f"device_id {device_id} of {count} devices")
        handle = runtime.cudaIpcMemHandle_t()
        ctypes.memmove(handle.getPtr(), raw_handle, IPC_HANDLE_SIZE)
        try:
            _ok(runtime.cudaSetDevice(device_id))
            self._pointer = int(_ok(runtime.cudaIpcOpenMemHandle(handle, runtime.cudaIpcMemLazyEnablePeerAccess)))
        except RuntimeError as error:
            raise self._invalid(f"cudaIpcOpenMemHandle: {error}") from None
        try:
            _base, size = _ok(driver.cuMemGetAddressRange(self._pointer))
        except RuntimeError as error:
            self.close()
            raise self._invalid(f"cuMemGetAddressRange: {error}") from None
        if byte_size > int(size):
            self.close()
            raise self._invalid(f"byte_size {byte_size} exceeds the {int(size)} bytes of the allocation")

    def _unsupported(self, reason: str) -> ServerError:
        return ServerError(f"failed to register CUDA shared memory region: '{self.name}', GPUs not supported "
                           f"({reason})")

    def _invalid(self, reason: str) -> ServerError:
        return ServerError(f"failed to register shared memory region '{self.name}': invalid args ({reason})")

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def read(self, offset: int, byte_size: int) -> memoryview:
        host = np.empty(byte_size, np.uint8)
        self._copy(host.ctypes.data, self._pointer + offset, byte_size, "cudaMemcpyDeviceToHost")
        return host.data

    def write(self, offset: int, data: memoryview) -> None:
        host = np.frombuffer(data, np.uint8)
        self._copy(self._pointer + offset, host.ctypes.data, host.size, "cudaMemcpyHostToDevice")

    def _copy(self, destination: int, source: int, byte_size: int, direction: str) -> None:
        runtime = self._runtime
        try:
            _ok(runtime.cudaSetDevice(self.device_id))
            _ok(runtime.cudaMemcpy(destination, source, byte_size, getattr(runtime.cudaMemcpyKind, direction)))
        except RuntimeError as error:
            raise ServerError(f"copying to or from CUDA shared memory region '{self.name}' failed: {error}",
                              Status.INTERNAL) from None

    def close(self) -> None:
        self._runtime.cudaSetDevice(self.device_id)
        self._runtime.cudaIpcCloseMemHandle(self._pointer)
