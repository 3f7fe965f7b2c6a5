"""Auto-complete: fill max_batch_size, inputs and outputs of a config from the OpenVINO model."""
from __future__ import annotations

from typing import cast

import openvino as ov
from openvino import layout_helpers

from triton_serve.plugin import DataType, ModelConfig, ModelInput, ModelOutput, ModelSpec, ServerError

from .datatypes import SERVED, config_type_of
from .model_file import new_core, read_model


def auto_complete_from_file(model: ModelSpec, default_max_batch_size: int) -> None:
    """Read ``model``'s file and auto-complete its config from it (see ``auto_complete``)."""
    core = new_core(model.parameters, model.name)
    auto_complete(model.config, read_model(core, model), model.name, default_max_batch_size)


def auto_complete(config: ModelConfig, model: ov.Model, model_name: str, default_max_batch_size: int) -> None:
    """Fill what the config leaves out, as Triton's OpenVINO backend does.

    max_batch_size (when 0) becomes ``default_max_batch_size`` if every input and output has a batch
    dimension first: a dynamic first dimension, or an ``N`` first in its layout. Inputs (outputs) are
    filled only when the config lists none: the tensor's first name, its type, and its dims (without
    the batch dimension when batching) with dynamic dimensions as -1.
    """
    if config.max_batch_size == 0 and _has_batch_dimension(model, config):
        config.max_batch_size = default_max_batch_size
    batching = config.max_batch_size > 0
    if not config.input:
        for port in model.inputs:
            _fill(config.input.add(), port, "input", model_name, batching)
    if not config.output:
        for port in model.outputs:
            _fill(config.output.add(), port, "output", model_name, batching)


def _tensor_name(port: ov.Output, kind: str, model_name: str) -> str:
    """The name a config uses for a model input or output: its first tensor name."""
    if not port.get_names():
        raise ServerError(f"model '{model_name}': {kind} {port.get_index()} of the model file has no tensor name, "
                          "so a config cannot refer to it")
    return port.get_any_name()


def _has_batch_dimension(model: ov.Model, config: ModelConfig) -> bool:
    tensors: list[ModelInput | ModelOutput] = [*config.input, *config.output]
    declared = {tensor.name: len(tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims)
                for tensor in tensors}
    for port in [*model.inputs, *model.outputs]:
        shape = port.get_partial_shape()
        if shape.rank.is_dynamic or shape.rank.get_length() == 0:
            return False
        layout = layout_helpers.get_layout(port)
        batch_first = shape[0].is_dynamic or (layout_helpers.has_batch(layout)
                                              and layout_helpers.batch_idx(layout) == 0)
        rank = shape.rank.get_length()
        # a config that declares the tensor with every dimension means the model does not batch
        if not batch_first or any(declared.get(name, rank - 1) != rank - 1 for name in port.get_names()):
            return False
    return True


def _fill(tensor: ModelInput | ModelOutput, port: ov.Output, kind: str, model_name: str, batching: bool) -> None:
    tensor.name = _tensor_name(port, kind, model_name)
    data_type = config_type_of(port.get_element_type())
    if data_type is None:
        raise ServerError(f"model '{model_name}': {kind} '{tensor.name}' has OpenVINO element type "
                          f"'{port.get_element_type().get_type_name()}', which the openvino backend does not "
                          f"serve (it serves {SERVED})")
    tensor.data_type = cast(DataType, DataType.Value(data_type))  # types-protobuf: Value returns int
    shape = port.get_partial_shape()
    if shape.rank.is_dynamic:
        raise ServerError(f"model '{model_name}': {kind} '{tensor.name}' has a dynamic rank; "
                          "list its dims in the model's config")
    dims = list(shape)[1:] if batching else list(shape)
    tensor.dims.extend(-1 if dim.is_dynamic else dim.get_length() for dim in dims)
