"""GPUs, streams and device memory through cuda-python's runtime bindings (``cuda.bindings.runtime``)."""
from __future__ import annotations

from typing import Any

import numpy as np
from cuda.bindings import runtime as cudart
from triton_serve.plugin import ServerError, Status


class CudaError(ServerError):
    """A CUDA runtime call failed; the message names the call and CUDA's error."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.INTERNAL)


def _check(call: str, result: tuple[Any, ...]) -> Any:
    """The value(s) a cuda-python call returned after its error code, or a CudaError."""
    error, *values = result
    if error != cudart.cudaError_t.cudaSuccess:
        name = cudart.cudaGetErrorName(error)[1].decode()
        text = cudart.cudaGetErrorString(error)[1].decode()
        raise CudaError(f"{call} failed: {name} ({text})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def device_count() -> int:
    return int(_check("cudaGetDeviceCount", cudart.cudaGetDeviceCount()))


def set_device(device: int) -> None:
    """Make ``device`` current for the calling thread (CUDA keeps the current device per thread)."""
    _check(f"cudaSetDevice({device})", cudart.cudaSetDevice(device))


def compute_capability(device: int) -> str:
    """The GPU's compute capability as "major.minor" (the keys of ``cc_model_filenames``)."""
    attr = cudart.cudaDeviceAttr
    major = _check("cudaDeviceGetAttribute", cudart.cudaDeviceGetAttribute(attr.cudaDevAttrComputeCapabilityMajor,
                                                                           device))
    minor = _check("cudaDeviceGetAttribute", cudart.cudaDeviceGetAttribute(attr.cudaDevAttrComputeCapabilityMinor,
                                                                           device))
    return f"{major}.{minor}"


class Stream:
    """A non-blocking CUDA stream on the current device."""

    def __init__(self) -> None:
        flags = cudart.cudaStreamNonBlocking
        self._stream = _check("cudaStreamCreateWithFlags", cudart.cudaStreamCreateWithFlags(flags))

    @property
    def raw(self) -> Any:
        return self._stream

    @property
    def handle(self) -> int:
        """The stream as the integer handle TensorRT's Python API takes."""
        return int(self._stream)

    def synchronize(self) -> None:
        _check("cudaStreamSynchronize", cudart.cudaStreamSynchronize(self._stream))

    def destroy(self) -> None:
        if self._stream is not None:
            _check("cudaStreamDestroy", cudart.cudaStreamDestroy(self._stream))
            self._stream = None


class DeviceBuffer:
    """Device memory for one tensor, grown (never shrunk) to the largest size asked for."""

    def __init__(self) -> None:
        self.pointer = 0
        self.capacity = 0

    def reserve(self, nbytes: int) -> int:
        """Make room for ``nbytes`` (at least one byte, so every tensor has an address); return the pointer."""
        if nbytes > self.capacity or not self.pointer:
            self.free()
            size = max(nbytes, 1)
            self.pointer = int(_check(f"cudaMalloc({size})", cudart.cudaMalloc(size)))
            self.capacity = size
        return self.pointer

    def free(self) -> None:
        if self.pointer:
            pointer, self.pointer, self.capacity = self.pointer, 0, 0
            _check("cudaFree", cudart.cudaFree(pointer))


def copy_to_device(buffer: DeviceBuffer, array: np.ndarray, stream: Stream) -> None:
    """Queue a copy of a C-contiguous host array into ``buffer``; keep ``array`` alive until the stream syncs."""
    if array.nbytes:
        _check("cudaMemcpyAsync (host to device)", cudart.cudaMemcpyAsync(
            buffer.pointer, array.ctypes.data, array.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream.raw))


def copy_to_host(array: np.ndarray, buffer: DeviceBuffer, stream: Stream) -> None:
    """Queue a copy of ``buffer`` into a C-contiguous host array; read it only after the stream syncs."""
    if array.nbytes:
        _check("cudaMemcpyAsync (device to host)", cudart.cudaMemcpyAsync(
            array.ctypes.data, buffer.pointer, array.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream.raw))
