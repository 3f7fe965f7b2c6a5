"""An exported program and its model config: fill the config's tensors from the program (auto-complete),
and check a config's tensors against the program at load."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from triton_serve.plugin import DataType, ModelConfig, ModelInput, ModelOutput, ServerError

from .datatypes import CONFIG_TYPES, torch_dtype
from .modelfile import TensorSignature


def fill_config(model: str, config: ModelConfig, inputs: Sequence[TensorSignature],
                outputs: Sequence[TensorSignature], default_max_batch_size: int) -> None:
    """Add the program's inputs (named like its arguments) and outputs (``OUTPUT__<i>``) to a config that
    lists none; set ``max_batch_size`` when the config leaves it 0 and every tensor's first dim is dynamic."""
    fill_inputs, fill_outputs = not config.input, not config.output
    tensors = [*inputs, *outputs]
    if (config.max_batch_size == 0 and fill_inputs and fill_outputs and inputs
            and all(tensor.first_dim_dynamic for tensor in tensors)):
        limits = [tensor.first_dim_max for tensor in tensors if tensor.first_dim_max is not None]
        config.max_batch_size = min([default_max_batch_size, *limits])
    batching = config.max_batch_size > 0
    if fill_inputs:
        for tensor in inputs:
            _describe(model, "input", config.input.add(), tensor.name, tensor, batching)
    if fill_outputs:
        for index, tensor in enumerate(outputs):
            _describe(model, "output", config.output.add(), f"OUTPUT__{index}", tensor, batching)


def check_config(model: str, config: ModelConfig, inputs: Sequence[TensorSignature],
                 outputs: Sequence[TensorSignature], input_positions: Mapping[str, int],
                 output_positions: Mapping[str, int]) -> None:
    """Raise a ServerError naming the first config tensor whose datatype or fixed dims contradict the program."""
    batching = config.max_batch_size > 0
    for spec in config.input:
        _check(model, "input", spec, inputs[input_positions[spec.name]], batching)
    for output in config.output:
        _check(model, "output", output, outputs[output_positions[output.name]], batching)


def _describe(model: str, kind: str, spec: ModelInput | ModelOutput, name: str, tensor: TensorSignature,
              batching: bool) -> None:
    if tensor.dtype not in CONFIG_TYPES:
        raise ServerError(f"pytorch model '{model}': exported program {kind} '{tensor.name}' is {tensor.dtype}, "
                          "which has no Triton datatype")
    spec.name = name
    spec.data_type = cast(DataType, DataType.Value(CONFIG_TYPES[tensor.dtype]))  # types-protobuf: Value returns int
    dims = tensor.shape[1:] if batching else tensor.shape
    if dims:
        spec.dims.extend(dims)
    else:  # Triton's way to declare a scalar: one element, reshaped to no dims
        spec.dims.append(1)
        spec.reshape.SetInParent()


def _check(model: str, kind: str, spec: ModelInput | ModelOutput, tensor: TensorSignature, batching: bool) -> None:
    declared = torch_dtype(spec.data_type)
    if declared != tensor.dtype:
        raise ServerError(f"pytorch model '{model}': the config declares {kind} '{spec.name}' as "
                          f"{DataType.Name(spec.data_type)}, but the exported program's {kind} '{tensor.name}' "
                          f"is {tensor.dtype}")
    dims = list(spec.reshape.shape if spec.HasField("reshape") else spec.dims)
    expected = [-1, *dims] if batching else dims
    if len(expected) != len(tensor.shape) or any(
            want != -1 and have != -1 and want != have for want, have in zip(expected, tensor.shape)):
        raise ServerError(f"pytorch model '{model}': the config gives {kind} '{spec.name}' shape {expected}, but "
                          f"the exported program's {kind} '{tensor.name}' has shape "
                          f"{list(tensor.shape)} (-1: dynamic)")
