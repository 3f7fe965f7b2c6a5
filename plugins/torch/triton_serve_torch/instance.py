"""One loaded copy of a PyTorch model: binds config tensors to forward and runs batches on its thread."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from triton_serve.plugin import DataType, FrameworkInstance, InstanceSpec, ServerError, Status

from .datatypes import to_array, to_tensor, torch_dtype
from .exported_config import check_config
from .modelfile import (AOTI_PLATFORM, AotiModel, ExportedModel, LoadedModel, TorchScriptModel, error_summary,
                        load_model)
from .naming import bind_inputs, bind_outputs
from .options import TorchModelOptions

if TYPE_CHECKING:
    from .model import PyTorchModel


class PyTorchModelInstance(FrameworkInstance):
    """Loads the model file onto the instance's device (``None``: as saved, KIND_MODEL) and runs
    forward under ``torch.inference_mode`` (``torch.no_grad`` when INFERENCE_MODE is false). Inputs
    go to the model's device, or stay on the CPU for KIND_MODEL, as in Triton."""

    model: PyTorchModel
    loaded: LoadedModel

    def __init__(self, model: PyTorchModel, spec: InstanceSpec, device: torch.device | None) -> None:
        super().__init__(model, spec)
        self.model_name = model.spec.name
        self.device = device
        self.input_device = device or torch.device("cpu")
        self.input_types = {t.name: torch_dtype(t.data_type) for t in model.spec.config.input}
        self.output_types = {t.name: torch_dtype(t.data_type) for t in model.spec.config.output}
        self.input_positions: dict[str, int] = {}
        self.output_positions: dict[str, int] = {}

    def open(self) -> None:
        path, name, config = self.model.path, self.model_name, self.model.spec.config
        aoti = config.platform == AOTI_PLATFORM
        kind = ("an AOTInductor package" if aoti else "an exported program" if path.suffix == ".pt2"
                else "TorchScript")
        try:
            loaded = load_model(path, self.device, aoti)
        except Exception as error:  # torch raises RuntimeError, BadZipFile, pickle and value errors
            raise ServerError(f"pytorch model '{name}': cannot load '{path.name}' as {kind}: "
                              f"{error_summary(error)}") from None
        if not loaded.takes_dict:
            self.input_positions = bind_inputs(name, [t.name for t in config.input],
                                               [argument.name for argument in loaded.arguments])
            unfed = [argument.name for position, argument in enumerate(loaded.arguments)
                     if argument.required and position not in self.input_positions.values()]
            if unfed:
                raise ServerError(f"pytorch model '{name}': forward argument(s) {unfed} have no default "
                                  "and no config input feeds them")
        self.output_positions = bind_outputs(name, [t.name for t in config.output], loaded.output_count,
                                             loaded.output_names if isinstance(loaded, AotiModel) else ())
        if isinstance(loaded, ExportedModel):
            check_config(name, config, loaded.inputs, loaded.outputs, self.input_positions,
                         self.output_positions)
        self.loaded = loaded

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """numpy inputs -> forward -> numpy outputs by config name."""
        loaded, options = self.loaded, self.model.options
        tensors = {name: to_tensor(array, self._input_type(name), self.input_device)
                   for name, array in inputs.items()}
        arguments = [tensors] if loaded.takes_dict else self._arguments(loaded, tensors)
        with self._execution_mode(loaded):
            try:
                results = loaded.run(arguments)
            except ServerError as error:
                raise ServerError(f"pytorch model '{self.model_name}': {error.message}", error.status) from None
            except Exception as error:  # what forward raises is the model's failure, not the server's
                raise ServerError(f"pytorch model '{self.model_name}' failed to execute: {error_summary(error)}",
                                  Status.INTERNAL) from None
            outputs = {name: self._output(name, results) for name in self.output_positions}
        if options.enable_cache_cleaning and self.input_device.type == "cuda":
            torch.cuda.empty_cache()
        return outputs

    def close(self) -> None:
        del self.loaded
        if self.input_device.type == "cuda":
            torch.cuda.empty_cache()

    def _input_type(self, name: str) -> torch.dtype:
        dtype = self.input_types.get(name)
        if dtype is None:
            raise ServerError(f"pytorch model '{self.model_name}' got input '{name}', which its config does not declare "
                              "as a tensor input")
        return dtype

    def _arguments(self, loaded: LoadedModel, tensors: dict[str, torch.Tensor]) -> list[Any]:
        given = {self.input_positions[name]: tensor for name, tensor in tensors.items()}
        arguments = []
        for position, argument in enumerate(loaded.arguments):
            if position in given:
                arguments.append(given[position])
            elif argument.required:
                raise ServerError(f"pytorch model '{self.model_name}' needs a tensor for forward argument "
                                  f"'{argument.name}', which has no default; the request left its input out")
            else:
                arguments.append(argument.default)
        return arguments

    def _output(self, name: str, results: list[Any]) -> np.ndarray:
        index = self.output_positions[name]
        if index >= len(results):
            raise ServerError(f"pytorch model '{self.model_name}': output '{name}' refers to forward's result "
                              f"{index}, but forward returned {len(results)} result(s)", Status.INTERNAL)
        value = results[index]
        if not isinstance(value, torch.Tensor):
            raise ServerError(f"pytorch model '{self.model_name}': output '{name}' is forward's result {index}, a "
                              f"{type(value).__name__}, not a Tensor", Status.INTERNAL)
        expected = self.output_types[name]
        if value.dtype != expected:
            declared = next(DataType.Name(t.data_type) for t in self.model.spec.config.output if t.name == name)
            raise ServerError(f"pytorch model '{self.model_name}': output '{name}' is {value.dtype}, but the config "
                              f"declares {declared}", Status.INTERNAL)
        return to_array(value)

    def _execution_mode(self, loaded: LoadedModel) -> contextlib.ExitStack:
        """Autograd off, and for TorchScript the JIT switches the model's parameters ask for."""
        stack = contextlib.ExitStack()
        options = self.model.options
        stack.enter_context(torch.inference_mode() if options.inference_mode else torch.no_grad())
        if isinstance(loaded, TorchScriptModel):
            stack.enter_context(torch.jit.optimized_execution(not options.disable_optimized_execution))
            set_jit_switches(options)
        return stack


def set_jit_switches(options: TorchModelOptions) -> None:
    """Apply ENABLE_JIT_EXECUTOR / ENABLE_JIT_PROFILING / ENABLE_TENSOR_FUSER where the config sets them.
    torch keeps these process-wide and offers them only through ``torch._C`` (Triton sets the same
    globals before each execution)."""
    if options.enable_jit_executor is not None:
        torch._C._jit_set_profiling_executor(options.enable_jit_executor)
    if options.enable_jit_profiling is not None:
        torch._C._jit_set_profiling_mode(options.enable_jit_profiling)
    if options.enable_tensor_fuser is not None:
        torch._C._jit_set_texpr_fuser_enabled(options.enable_tensor_fuser)

