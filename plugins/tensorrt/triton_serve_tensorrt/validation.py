"""Check a model config against the engine it loads, and the output shapes an execution produces.

Every error names the model, the tensor and the config field at fault."""
from __future__ import annotations

from collections.abc import Sequence

from triton_serve.plugin import DataType, ModelConfig, ModelInput, ModelOutput, ServerError, Status

from .engine_description import EngineDescription, Shape, TensorDescription
from .profiles import profile_max_batch_size

ConfigTensor = ModelInput | ModelOutput


def check_config_against_engine(model: str, config: ModelConfig, engine: EngineDescription,
                                profiles: Sequence[int]) -> None:
    """Raise a ServerError unless an instance using ``profiles`` can serve ``config`` with ``engine``."""
    _check_supported(model, config, engine)
    check_tensor_names(model, config, engine)
    declared = {tensor.name for tensor in config.input}
    for found in engine.inputs:
        if found.name not in declared:
            raise ServerError(f"model '{model}': engine input '{found.name}' is missing from the config's "
                              "inputs; TensorRT needs a value for every engine input")
    batching = config.max_batch_size > 0
    if batching:
        _check_batching(model, config.max_batch_size, engine, profiles)
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            described = engine.get(tensor.name)
            assert described is not None  # check_tensor_names saw to it
            _check_tensor(model, kind, tensor, described, batching, profiles)


def check_tensor_names(model: str, config: ModelConfig, engine: EngineDescription) -> None:
    """Every tensor the config names must be an engine tensor of the same direction."""
    for kind, tensors, allowed in (("input", config.input, engine.inputs), ("output", config.output, engine.outputs)):
        names = [tensor.name for tensor in allowed]
        for tensor in tensors:
            if tensor.name not in names:
                raise ServerError(f"model '{model}': config {kind} '{tensor.name}' is not an {kind} of the "
                                  f"engine; its {kind}s are {names}")


def resolve_output_shape(model: str, name: str, shape: Shape) -> Shape:
    """An output's concrete shape once the input shapes are set; -1 left in it means TensorRT can
    know the shape only after running (data-dependent), which this backend does not support."""
    if any(dim < 0 for dim in shape):
        raise ServerError(f"model '{model}': output '{name}' has shape {list(shape)} after the input shapes are "
                          "set; outputs whose shape depends on input values are not supported", Status.UNSUPPORTED)
    return tuple(shape)


def _check_supported(model: str, config: ModelConfig, engine: EngineDescription) -> None:
    for found in engine.tensors:
        if found.is_shape_tensor:
            raise ServerError(f"model '{model}': engine tensor '{found.name}' is a shape tensor; this backend "
                              "does not serve engines with shape tensors", Status.UNSUPPORTED)
    if config.batch_input or config.batch_output:
        raise ServerError(f"model '{model}': batch_input and batch_output are not supported by this backend",
                          Status.UNSUPPORTED)
    for tensor in config.input:
        if tensor.allow_ragged_batch:
            raise ServerError(f"model '{model}': input '{tensor.name}' sets allow_ragged_batch, which this "
                              "backend does not support", Status.UNSUPPORTED)
        if tensor.optional:
            raise ServerError(f"model '{model}': input '{tensor.name}' is optional, but a TensorRT engine "
                              "needs a value for every input", Status.UNSUPPORTED)
    every_tensor: list[ConfigTensor] = [*config.input, *config.output]
    for listed in every_tensor:
        if listed.is_non_linear_format_io:
            raise ServerError(f"model '{model}': '{listed.name}' sets is_non_linear_format_io, which this "
                              "backend does not support", Status.UNSUPPORTED)


def _check_batching(model: str, max_batch: int, engine: EngineDescription, profiles: Sequence[int]) -> None:
    fixed = [tensor.name for tensor in engine.tensors if not tensor.has_batch_dim]
    if fixed:
        raise ServerError(f"model '{model}': max_batch_size is {max_batch}, but engine tensor(s) {fixed} have no "
                          "dynamic first dimension to batch along; set max_batch_size: 0")
    limit = max(profile_max_batch_size(engine, profile) for profile in profiles)
    if max_batch > limit:
        raise ServerError(f"model '{model}': max_batch_size is {max_batch}, but the optimization profile(s) "
                          f"{list(profiles)} this instance uses take batches of at most {limit}")


def _check_tensor(model: str, kind: str, tensor: ConfigTensor, found: TensorDescription, batching: bool,
                  profiles: Sequence[int]) -> None:
    where = f"model '{model}': {kind} '{tensor.name}'"
    engine_type = found.config_type(model)
    if DataType.Name(tensor.data_type) != engine_type:
        raise ServerError(f"{where}: data_type is {DataType.Name(tensor.data_type)} in the config, but the "
                          f"engine's tensor is {engine_type}")
    field = "reshape.shape" if tensor.HasField("reshape") else "dims"
    dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
    full = [-1, *dims] if batching else dims
    if len(full) != len(found.shape):
        batch_note = " (after the batch dimension)" if batching else ""
        raise ServerError(f"{where}: {field} {dims}{batch_note} does not match the engine's shape "
                          f"{list(found.shape)}")
    offset = 1 if batching else 0
    for index in range(offset, len(full)):
        wanted, engine_dim = full[index], found.shape[index]
        label = f"{field}[{index - offset}]"
        if engine_dim != -1:
            if wanted != engine_dim:
                raise ServerError(f"{where}: {label} is {wanted} in the config, but the engine fixes that "
                                  f"dimension at {engine_dim}")
        elif wanted != -1 and found.is_input and not _some_profile_allows(found, profiles, index, wanted):
            ranges = ", ".join(f"profile {p}: {found.profiles[p].min[index]}..{found.profiles[p].max[index]}"
                               for p in profiles)
            raise ServerError(f"{where}: {label} is {wanted} in the config, which no optimization profile this "
                              f"instance uses allows ({ranges})")


def _some_profile_allows(found: TensorDescription, profiles: Sequence[int], index: int, size: int) -> bool:
    return any(found.profiles[p].min[index] <= size <= found.profiles[p].max[index] for p in profiles)
