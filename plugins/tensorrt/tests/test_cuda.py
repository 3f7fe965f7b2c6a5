"""cuda-python device buffers and streams (needs an NVIDIA GPU; TensorRT is not needed)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from triton_serve.plugin import ServerError


def _gpu_count() -> int:
    try:
        from triton_serve_tensorrt import cuda
        return cuda.device_count()
    except (ImportError, ServerError):  # cuda-python missing, or no driver or GPU
        return 0


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_gpu_count() == 0, reason="needs an NVIDIA GPU usable by cuda-python")]


def test_a_device_buffer_round_trips_through_a_stream_and_grows() -> None:
    from triton_serve_tensorrt import cuda

    cuda.set_device(0)
    stream, buffer = cuda.Stream(), cuda.DeviceBuffer()
    try:
        assert isinstance(stream.handle, int) and stream.handle != 0
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        buffer.reserve(data.nbytes)
        cuda.copy_to_device(buffer, data, stream)
        back = np.empty_like(data)
        cuda.copy_to_host(back, buffer, stream)
        stream.synchronize()
        np.testing.assert_array_equal(back, data)

        pointer = buffer.pointer
        assert buffer.reserve(8) == pointer and buffer.capacity == data.nbytes  # never shrinks
        buffer.reserve(1 << 20)
        assert buffer.capacity == 1 << 20
        big = np.random.default_rng(0).integers(0, 255, size=1 << 20, dtype=np.uint8)
        cuda.copy_to_device(buffer, big, stream)
        back_big = np.zeros_like(big)
        cuda.copy_to_host(back_big, buffer, stream)
        stream.synchronize()
        np.testing.assert_array_equal(back_big, big)
    finally:
        buffer.free()
        stream.destroy()
    assert buffer.pointer == 0


def test_compute_capability_and_errors() -> None:
    from triton_serve_tensorrt import cuda

    assert re.fullmatch(r"\d+\.\d+", cuda.compute_capability(0))
    with pytest.raises(cuda.CudaError, match=r"cudaSetDevice\(4096\) failed: cudaErrorInvalidDevice"):
        cuda.set_device(4096)
