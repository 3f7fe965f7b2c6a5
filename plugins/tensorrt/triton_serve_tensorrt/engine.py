"""Everything that calls TensorRT: loading a plan, describing the engine, and running batches.

Written against TensorRT 10's Python API; imported only once ``import tensorrt`` is known to work.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorrt as trt
from triton_serve.plugin import DataType, ServerError, Status, datatype_of_config

from . import cuda
from .engine_description import EngineDescription, ProfileShapes, TensorDescription
from .profiles import select_profile
from .validation import resolve_output_shape

log = logging.getLogger(__name__)

_ERRORS = (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR)
_LEVELS = {trt.ILogger.Severity.INTERNAL_ERROR: logging.ERROR, trt.ILogger.Severity.ERROR: logging.ERROR,
           trt.ILogger.Severity.WARNING: logging.WARNING, trt.ILogger.Severity.INFO: logging.DEBUG,
           trt.ILogger.Severity.VERBOSE: logging.DEBUG}


class _ForwardingLogger(trt.ILogger):
    """Sends TensorRT's messages to Python logging and remembers the last error for error messages."""

    def __init__(self) -> None:
        trt.ILogger.__init__(self)
        self.last_error = ""

    def log(self, severity: Any, msg: str) -> None:
        if severity in _ERRORS:
            self.last_error = msg
        log.log(_LEVELS.get(severity, logging.DEBUG), "TensorRT: %s", msg)


@dataclass
class LoadedEngine:
    """A deserialized engine with the runtime and logger it must not outlive."""

    engine: Any
    runtime: Any
    logger: _ForwardingLogger


def load_engine(plan: Path, device: int) -> LoadedEngine:
    """Deserialize a plan on GPU ``device``; a file TensorRT cannot load is a clear INVALID_ARG error."""
    cuda.set_device(device)
    logger = _ForwardingLogger()
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(plan.read_bytes())
    if engine is None:
        detail = logger.last_error or "TensorRT gave no reason"
        raise ServerError(f"'{plan.name}' is not a TensorRT engine that TensorRT {trt.__version__} can load on "
                          f"GPU {device} (a plan only loads with the TensorRT version and GPU model it was built "
                          f"for): {detail}")
    return LoadedEngine(engine, runtime, logger)


def describe_engine(engine: Any) -> EngineDescription:
    """The engine's IO tensors, shapes and per-profile input shape ranges, as plain data."""
    num_profiles = max(engine.num_optimization_profiles, 1)
    tensors = []
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        is_shape = bool(engine.is_shape_inference_io(name))
        profiles: tuple[ProfileShapes, ...] = ()
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        if is_input and not is_shape:
            profiles = tuple(_profile_shapes(engine.get_tensor_profile_shape(name, p), shape)
                             for p in range(num_profiles))
        tensors.append(TensorDescription(name, is_input, engine.get_tensor_dtype(name).name, shape, is_shape,
                                         profiles))
    return EngineDescription(tuple(tensors), num_profiles)


def _profile_shapes(shapes: Sequence[Any], engine_shape: tuple[int, ...]) -> ProfileShapes:
    """A profile's [min, opt, max]; a static input (no profile shapes of its rank) takes only its own shape."""
    found = [tuple(int(d) for d in shape) for shape in shapes]
    if len(found) != 3 or any(len(shape) != len(engine_shape) for shape in found):
        return ProfileShapes(engine_shape, engine_shape, engine_shape)
    return ProfileShapes(*found)


def numpy_dtype(tensor: TensorDescription, model: str) -> np.dtype:
    """The host dtype of a tensor's bytes (BF16 as raw uint16, as the server carries it)."""
    return datatype_of_config(DataType.Value(tensor.config_type(model))).numpy


class ExecutionSession:
    """One execution context and CUDA stream on one GPU, with device buffers that grow to the
    largest batch seen. Not thread-safe: one batch at a time (the scheduler guarantees it)."""

    def __init__(self, model: str, loaded: LoadedEngine, description: EngineDescription, device: int,
                 profiles: Sequence[int], returned_outputs: Sequence[str]) -> None:
        self.model = model
        self.device = device
        self.profiles = list(profiles)
        self.description = description
        self.returned_outputs = list(returned_outputs)
        self._logger = loaded.logger
        cuda.set_device(device)
        self.stream = cuda.Stream()
        self.context = loaded.engine.create_execution_context()
        if self.context is None:
            self.stream.destroy()
            raise ServerError(f"model '{model}': TensorRT could not create an execution context on GPU {device}: "
                              f"{self._logger.last_error or 'out of GPU memory?'}", Status.INTERNAL)
        self.active_profile = 0  # a new context starts on profile 0
        self.buffers = {tensor.name: cuda.DeviceBuffer() for tensor in description.tensors}
        self.dtypes = {tensor.name: numpy_dtype(tensor, model) for tensor in description.tensors}

    def run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch (input name -> array) and return the declared outputs by name."""
        cuda.set_device(self.device)
        shapes = {name: tuple(array.shape) for name, array in arrays.items()}
        profile = select_profile(self.model, self.description, self.profiles, shapes)
        if profile != self.active_profile:
            self._require(self.context.set_optimization_profile_async(profile, self.stream.handle),
                          f"switch to optimization profile {profile}")
            self.active_profile = profile
        staged = []  # the host inputs must live until the stream syncs
        for tensor in self.description.inputs:
            array = np.ascontiguousarray(arrays[tensor.name], dtype=self.dtypes[tensor.name])
            self._require(self.context.set_input_shape(tensor.name, array.shape),
                          f"set input '{tensor.name}' to shape {list(array.shape)}", Status.INVALID_ARG)
            buffer = self.buffers[tensor.name]
            buffer.reserve(array.nbytes)
            cuda.copy_to_device(buffer, array, self.stream)
            self._require(self.context.set_tensor_address(tensor.name, buffer.pointer),
                          f"bind input '{tensor.name}'")
            staged.append(array)
        results = {}
        for tensor in self.description.outputs:
            shape = resolve_output_shape(self.model, tensor.name, tuple(self.context.get_tensor_shape(tensor.name)))
            host = np.empty(shape, dtype=self.dtypes[tensor.name])
            buffer = self.buffers[tensor.name]
            buffer.reserve(host.nbytes)
            self._require(self.context.set_tensor_address(tensor.name, buffer.pointer),
                          f"bind output '{tensor.name}'")
            results[tensor.name] = host
        self._require(self.context.execute_async_v3(self.stream.handle), "run the engine")
        for name, host in results.items():
            cuda.copy_to_host(host, self.buffers[name], self.stream)
        self.stream.synchronize()
        return {name: results[name] for name in self.returned_outputs}

    def close(self) -> None:
        """Free the context, buffers and stream; the session cannot run afterwards."""
        cuda.set_device(self.device)
        self.context = None
        for buffer in self.buffers.values():
            buffer.free()
        self.stream.destroy()

    def _require(self, ok: bool, action: str, status: Status = Status.INTERNAL) -> None:
        if not ok:
            detail = self._logger.last_error or "see the server log"
            raise ServerError(f"model '{self.model}': TensorRT could not {action}: {detail}", status)
