"""Checks that a model's config agrees with its ONNX model: tensor names, datatypes and dims."""
from __future__ import annotations

from triton_serve.batch import datatype_of_config
from triton_serve.plugin import ServerError
from triton_serve.protos.model_config_pb2 import ModelConfig, ModelInput, ModelOutput

from .signature import ModelSignature, TensorInfo
from .tensors import unsupported_type


def check_config_matches_model(config: ModelConfig, signature: ModelSignature, model_name: str) -> None:
    """Raise a ServerError naming the model, the tensor and the field where the config contradicts the model."""
    batching = config.max_batch_size > 0
    model_inputs = {**signature.initializers, **signature.inputs}
    for spec in config.input:
        info = model_inputs.get(spec.name)
        if info is None:
            raise ServerError(f"model '{model_name}': configuration input '{spec.name}' is not an input of the "
                              f"ONNX model (its inputs: {', '.join(signature.inputs) or 'none'})")
        _check_tensor("input", spec, info, batching, model_name)
    fed = _fed_input_names(config)
    unfed = [name for name in signature.inputs if name not in fed]
    if unfed:
        raise ServerError(f"model '{model_name}': the ONNX model needs input(s) {unfed}, which the configuration "
                          "does not list")
    for output in config.output:
        info = signature.outputs.get(output.name)
        if info is None:
            raise ServerError(f"model '{model_name}': configuration output '{output.name}' is not an output of "
                              f"the ONNX model (its outputs: {', '.join(signature.outputs) or 'none'})")
        _check_tensor("output", output, info, batching, model_name)


def _fed_input_names(config: ModelConfig) -> set[str]:
    """Model inputs the server fills: config inputs, batch inputs and sequence controls and states."""
    names = {spec.name for spec in config.input}
    names.update(target for batch_input in config.batch_input for target in batch_input.target_name)
    names.update(control.name for control in config.sequence_batching.control_input)
    names.update(state.input_name for state in config.sequence_batching.state)
    return names


def _check_tensor(kind: str, spec: ModelInput | ModelOutput, info: TensorInfo, batching: bool,
                  model_name: str) -> None:
    where = f"model '{model_name}': {kind} '{spec.name}'"
    if info.data_type is None:
        raise unsupported_type(kind, spec.name, info.ort_type, model_name)
    configured = datatype_of_config(spec.data_type).config_name
    if configured != info.data_type:
        raise ServerError(f"{where} has data_type {configured} in the configuration, but the ONNX model's "
                          f"{kind} is {info.data_type}")
    model_shape = list(info.dims)
    if isinstance(spec, ModelInput) and spec.allow_ragged_batch:
        if model_shape != [-1]:
            raise ServerError(f"{where} allows ragged batches, so the ONNX model's shape must be [-1], "
                              f"not {model_shape}")
        return
    dims = list(spec.reshape.shape) if spec.HasField("reshape") else list(spec.dims)
    field = "reshape.shape" if spec.HasField("reshape") else "dims"
    if batching and (not model_shape or model_shape[0] != -1):
        raise ServerError(f"{where}: max_batch_size > 0 needs a variable first dimension in the ONNX model, "
                          f"whose shape is {model_shape}")
    if not model_shape:
        if any(dim != 1 for dim in dims):
            raise ServerError(f"{where} is a scalar in the ONNX model, so its {field} must be [1], not {dims}")
        return
    expected = [-1, *dims] if batching else dims
    matches = len(model_shape) == len(expected) and all(
        m in (-1, e) for m, e in zip(model_shape, expected, strict=True))
    if not matches:
        full = f" (with the batch dimension: {expected})" if batching else ""
        raise ServerError(f"{where} has {field} {dims} in the configuration{full}, but the ONNX model's shape "
                          f"is {model_shape}")
