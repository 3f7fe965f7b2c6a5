"""Checks that a model's config agrees with its ONNX model, as Triton's ONNX Runtime backend makes them
(``ValidateInputs``, ``ValidateOutputs`` and ``CompareDimsSupported``), with its messages."""
from __future__ import annotations

from collections.abc import Sequence

from triton_serve.plugin import (ModelConfig, ModelInput, ModelOutput, ModelSequenceBatching, ServerError,
                                 datatype_of_config)

from .signature import ModelSignature, TensorInfo
from .tensors import unsupported_type

_CONTROL_KINDS = (ModelSequenceBatching.Control.CONTROL_SEQUENCE_START,
                  ModelSequenceBatching.Control.CONTROL_SEQUENCE_END,
                  ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY,
                  ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID)


def check_config_matches_model(config: ModelConfig, signature: ModelSignature, model_name: str) -> None:
    """Raise a ServerError with Triton's message where the config contradicts the model."""
    expected = _expected_input_count(config)
    if len(signature.inputs) != expected:
        raise ServerError(f"unable to load model '{model_name}', configuration expects {expected} inputs, "
                          f"model provides {len(signature.inputs)}")
    model_inputs = {**signature.initializers, **signature.inputs}
    for spec in config.input:
        if spec.optional and config.max_batch_size != 0:
            raise ServerError(f"unable to load model '{model_name}', optional input '{spec.name}' is not supported "
                              "for models that support batching")
        info = model_inputs.get(spec.name)
        if info is None:
            raise ServerError(f"unexpected inference input '{spec.name}', allowed inputs are: "
                              + ", ".join(sorted(model_inputs)))
        _check_datatype("input", spec, info, model_name)
        dims = _dims(spec)
        if spec.allow_ragged_batch:
            if spec.optional:
                raise ServerError(f"unable to load model '{model_name}', configuration expects model provides input "
                                  f"with shape [-1] for ragged input '{spec.name}', which is not supported for "
                                  "optional input")
            if list(info.dims) != [-1]:
                # Triton's text has two spaces after "[-1]": kept as it is.
                raise ServerError(f"unable to load model '{model_name}', configuration expects model provides input "
                                  f"with shape [-1]  for ragged input '{spec.name}', model provides "
                                  f"{_shape(info.dims)}")
            continue
        _check_dims(model_name, spec.name, list(info.dims), dims, config.max_batch_size, exact=False)
    batch_outputs = {target for batch_output in config.batch_output for target in batch_output.target_name}
    for output in config.output:
        info = signature.outputs.get(output.name)
        if info is None:
            raise ServerError(f"unexpected inference output '{output.name}', allowed outputs are: "
                              + ", ".join(sorted(signature.outputs)))
        _check_datatype("output", output, info, model_name)
        if output.name not in batch_outputs:  # a batch output's shape need not match the model
            _check_dims(model_name, output.name, list(info.dims), _dims(output), config.max_batch_size, exact=True)


def _expected_input_count(config: ModelConfig) -> int:
    """Model inputs the server fills: required config inputs, batch inputs, sequence controls and states."""
    controls = {control.kind for control_input in config.sequence_batching.control_input
                for control in control_input.control}
    return (sum(1 for spec in config.input if not spec.optional) + len(config.batch_input)
            + sum(1 for kind in _CONTROL_KINDS if kind in controls) + len(config.sequence_batching.state))


def _dims(spec: ModelInput | ModelOutput) -> list[int]:
    return list(spec.reshape.shape) if spec.HasField("reshape") else list(spec.dims)


def _shape(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(dim) for dim in dims) + "]"


def _check_datatype(kind: str, spec: ModelInput | ModelOutput, info: TensorInfo, model_name: str) -> None:
    if info.data_type is None:
        raise unsupported_type(kind, spec.name, info.ort_type, model_name)
    configured = datatype_of_config(spec.data_type).config_name
    if configured != info.data_type:
        raise ServerError(f"unable to load model '{model_name}', configuration expects datatype {configured} for "
                          f"{kind} '{spec.name}', model provides {info.data_type}")


def _check_dims(model_name: str, name: str, model_shape: list[int], dims: list[int], max_batch_size: int,
                exact: bool) -> None:
    if not model_shape:  # a scalar in the model
        if any(dim != 1 for dim in dims):
            raise ServerError(f"unable to load model '{model_name}', scalar tensor '{name}', should only provide 1 "
                              "in the model configuration when the model doesn't support batching. Model "
                              f"configuration provided: {_shape(dims)}.")
        return
    where = f"model '{model_name}', tensor '{name}'"
    full = dims
    if max_batch_size > 0:
        if model_shape[0] != -1:
            raise ServerError(f"{where}: for the model to support batching the shape should have at least 1 "
                              "dimension and the first dimension must be -1; but shape expected by the model is "
                              f"{_shape(model_shape)}")
        full = [-1, *dims]
    fits = len(model_shape) == len(full) and all(
        model == configured for model, configured in zip(model_shape, full) if exact or model != -1)
    if fits:
        return
    if max_batch_size > 0:
        raise ServerError(f"{where}: the model expects {len(model_shape)} dimensions (shape {_shape(model_shape)}) "
                          f"but the model configuration specifies {len(full)} dimensions (an initial batch "
                          "dimension because max_batch_size > 0 followed by the explicit tensor shape, making "
                          f"complete shape {_shape(full)})")
    raise ServerError(f"{where}: the model expects {len(model_shape)} dimensions (shape {_shape(model_shape)}) but "
                      f"the model configuration specifies {len(dims)} dimensions (shape {_shape(dims)})")
