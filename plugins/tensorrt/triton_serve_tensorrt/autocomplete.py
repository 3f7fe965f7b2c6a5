"""Auto-complete: fill a model config's inputs, outputs, max_batch_size and GPU instance groups from
an engine description, by Triton's TensorRT rules."""
from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from triton_serve.plugin import DataType, ModelConfig, ServerError

from .engine_description import EngineDescription, TensorDescription
from .profiles import max_batch_size, model_profile_indices
from .validation import ConfigTensor, check_tensor_names


def complete_config(model: str, config: ModelConfig, engine: EngineDescription) -> None:
    """Fill ``config`` in place. Tensors the config lists keep what they set; a config that lists
    no inputs (outputs) gets every engine input (output)."""
    check_tensor_names(model, config, engine)
    hint = batching_hint(model, config, engine)
    profiles = model_profile_indices(config, engine.num_profiles, model)
    engine_limit = max_batch_size(engine, profiles)
    cannot_batch = "the engine cannot batch (every IO tensor needs a dynamic first dimension)"
    if hint is True and engine_limit == 0:
        raise ServerError(f"model '{model}': the config's tensor dims leave out a batch dimension, but {cannot_batch}")
    wanted = config.max_batch_size
    if wanted > 0 and hint is False:
        raise ServerError(f"model '{model}': max_batch_size is {wanted}, but the config's tensor dims are as long "
                          "as the engine's shapes, leaving no batch dimension")
    if wanted > 0 and engine_limit == 0:
        raise ServerError(f"model '{model}': max_batch_size is {wanted}, but {cannot_batch}")
    if wanted > engine_limit:
        raise ServerError(f"model '{model}': max_batch_size is {wanted}, but the engine's optimization "
                          f"profile(s) {profiles} take batches of at most {engine_limit}")
    if wanted == 0 and hint is not False:
        config.max_batch_size = engine_limit
    batching = config.max_batch_size > 0
    _complete_tensors(model, config.input, engine.inputs, batching)
    _complete_tensors(model, config.output, engine.outputs, batching)


def batching_hint(model: str, config: ModelConfig, engine: EngineDescription) -> bool | None:
    """What the dims a config gives say about batching: True when they are one shorter than the
    engine's shapes (the batch dimension left out), False when as long, None when no tensor tells."""
    hints: dict[str, bool] = {}
    tensors: list[ConfigTensor] = [*config.input, *config.output]
    for tensor in tensors:
        found = engine.get(tensor.name)
        dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
        if found is None or found.is_shape_tensor or not dims:
            continue
        if len(dims) + 1 == len(found.shape):
            hints[tensor.name] = True
        elif len(dims) == len(found.shape):
            hints[tensor.name] = False
    if len(set(hints.values())) > 1:
        with_batch = sorted(name for name, batch in hints.items() if batch)
        without = sorted(name for name, batch in hints.items() if not batch)
        raise ServerError(f"model '{model}': the config's dims contradict each other about batching: "
                          f"{with_batch} leave out a batch dimension, {without} do not")
    return next(iter(hints.values()), None)


def _complete_tensors(model: str, tensors: Iterable[ConfigTensor], engine_tensors: list[TensorDescription],
                      batching: bool) -> None:
    listed = list(tensors)
    if not listed:
        for found in engine_tensors:
            new = tensors.add(name=found.name)  # type: ignore[attr-defined]
            _fill(model, new, found, batching)
        return
    by_name = {found.name: found for found in engine_tensors}
    for tensor in listed:
        _fill(model, tensor, by_name[tensor.name], batching)


def _fill(model: str, tensor: ConfigTensor, found: TensorDescription, batching: bool) -> None:
    if tensor.data_type == DataType.TYPE_INVALID:
        tensor.data_type = cast(DataType, DataType.Value(found.config_type(model)))  # types-protobuf: Value returns int
    if tensor.is_shape_tensor and not found.is_shape_tensor:
        raise ServerError(f"model '{model}': '{tensor.name}' is marked is_shape_tensor in the config, "
                          "but it is an execution tensor of the engine")
    tensor.is_shape_tensor = found.is_shape_tensor
    if tensor.dims:
        return
    if found.is_shape_tensor:
        if found.shape:
            tensor.dims.append(found.shape[0] - 1 if batching else found.shape[0])
        return
    dims = found.shape[1:] if batching else found.shape
    if dims:
        tensor.dims.extend(dims)
    else:  # a scalar: config dims cannot be empty, so [1] reshaped to []
        tensor.dims.append(1)
        tensor.reshape.SetInParent()
