"""Triton's rules for a model configuration, with Triton's messages.

``validate_config`` applies, in Triton 2.51's order, the checks of its core's
``ValidateModelConfig``, ``ValidateInstanceGroup`` and ``ValidateModelIOConfig``
(``model_config_utils.cc``), then the few checks triton-serve adds where Triton would fail later
or not at all (see docs/compatibility.md). Backend-specific checks live in each backend plugin.
Ensemble rules belong to the ensemble scheduler.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .errors import ServerError
from .protos.model_config_pb2 import (
    BatchInput,
    BatchOutput,
    DataType,
    ModelConfig,
    ModelInput,
    ModelInstanceGroup,
    ModelOutput,
    ModelQueuePolicy,
    ModelSequenceBatching,
)

ENSEMBLE_PLATFORM = "ensemble"
TENSORRT_PLATFORM = "tensorrt_plan"
WILDCARD_DIM = -1
# Triton's backend names and platforms that must agree when a config gives both.
_BACKEND_OF_PLATFORM = {"tensorflow_graphdef": "tensorflow", "tensorflow_savedmodel": "tensorflow",
                        "tensorrt_plan": "tensorrt", "onnxruntime_onnx": "onnxruntime",
                        "pytorch_libtorch": "pytorch", "torch_aoti": "pytorch"}
_KNOWN_BACKENDS = {"tensorflow", "tensorrt", "onnxruntime", "pytorch"}
_CORRID_TYPES = (DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32, DataType.TYPE_INT32,
                 DataType.TYPE_STRING)
_Control = ModelSequenceBatching.Control


_Tensor = ModelInput | ModelOutput


def invalid(message: str) -> ServerError:
    """A config error: INVALID_ARGUMENT with Triton's message."""
    return ServerError(message)


def validate_config(config: ModelConfig, model_dir: Path | None = None) -> None:
    """Raise ServerError with Triton's message on the first rule the (defaulted, auto-completed)
    config breaks."""
    validate_model_config(config)
    validate_instance_groups(config)
    validate_model_io(config)
    _validate_beyond_triton(config, model_dir)


# ---- ValidateModelConfig -------------------------------------------------------------------

def validate_model_config(config: ModelConfig) -> None:
    """Triton's ``ValidateModelConfig``: platform and backend, batching, scheduling, cache, metrics."""
    name = config.name
    if not name:
        raise invalid("model configuration must specify 'name'")
    if not config.backend:
        if config.platform != ENSEMBLE_PLATFORM:
            raise invalid(f"unexpected platform type '{config.platform}' for {name}")
    elif config.platform == ENSEMBLE_PLATFORM:
        raise invalid(f"Ensemble model '{name}' must have platform type '{config.platform}' and empty backend type")
    known = config.backend if config.backend in _KNOWN_BACKENDS else None
    if known is not None and config.platform and _BACKEND_OF_PLATFORM.get(config.platform) != known:
        raise invalid(f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {config.backend}")
    if config.max_batch_size < 0:
        raise invalid(f"'max_batch_size' must be non-negative value for {name}")
    if not config.HasField("version_policy"):
        raise invalid(f"must specify 'version policy' for {name}")
    if config.HasField("dynamic_batching"):
        _validate_dynamic_batching(config)
    if config.HasField("sequence_batching"):
        _validate_sequence_batching(config)
    if not config.HasField("ensemble_scheduling") and config.platform == ENSEMBLE_PLATFORM:
        raise invalid(f"ensemble scheduling must be set for ensemble {name} whose platform is {ENSEMBLE_PLATFORM}")
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise invalid(f"Response Cache does not currently support model {name} with 'decoupled' transaction "
                      "policy. Please disable the response cache.")
    for control in config.model_metrics.metric_control:
        if not control.HasField("metric_identifier"):
            raise invalid("metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise invalid("metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise invalid("metric control must specify 'histogram_options'")
        if not control.histogram_options.buckets:
            raise invalid("histogram options must specify non-empty 'buckets'")


def _validate_dynamic_batching(config: ModelConfig) -> None:
    name, batching = config.name, config.dynamic_batching
    for size in batching.preferred_batch_size:
        if size <= 0:
            raise invalid(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise invalid(f"dynamic batching preferred size must be <= max batch size for {name}")
    levels = batching.priority_levels
    if levels != 0:
        if batching.default_priority_level == 0 or batching.default_priority_level > levels:
            raise invalid(f"default priority level must be in range [1, {levels}] for {name}")
        for level in batching.priority_queue_policy:
            if level == 0 or level > levels:
                raise invalid(f"priority queue policy must have priority level in range [1, {levels}] for {name}")
    if batching.preserve_ordering:
        if levels > 1:
            raise invalid(f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
        for policy in (batching.default_queue_policy, *batching.priority_queue_policy.values()):
            if policy.default_timeout_microseconds != 0 and policy.timeout_action == ModelQueuePolicy.DELAY:
                raise invalid("Queue policy can not have DELAY as timeout action when 'preserve_ordering' is "
                              f"true for {name}")


def _validate_sequence_batching(config: ModelConfig) -> None:
    name, batcher = config.name, config.sequence_batching
    if config.response_cache.enable:
        raise invalid(f"Response Cache does not currently support model {name} with sequence batching "
                      "scheduler. Please disable the response cache.")
    for kind in (_Control.CONTROL_SEQUENCE_START, _Control.CONTROL_SEQUENCE_END, _Control.CONTROL_SEQUENCE_READY):
        _boolean_control(batcher, name, kind)
    corrid = _typed_control(batcher, name, _Control.CONTROL_SEQUENCE_CORRID)
    if corrid is not None and corrid.data_type not in _CORRID_TYPES:
        raise invalid(f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed data types "
                      "are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING")
    if batcher.HasField("oldest"):
        for size in batcher.oldest.preferred_batch_size:
            if size <= 0:
                raise invalid(f"sequence batching preferred batch size must be positive for {name}")
            if size > config.max_batch_size:
                raise invalid(f"sequence batching preferred batch size must be <= max batch size for {name}")
    if batcher.HasField("direct"):
        utilization = batcher.direct.minimum_slot_utilization
        if utilization < 0.0 or utilization > 1.0:
            raise invalid(f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}")


def _controls(batcher: ModelSequenceBatching, name: str, kind: int) -> list[_Control]:
    """The controls of ``kind``, after Triton's checks common to every control kind."""
    seen_tensors: set[str] = set()
    found: list[_Control] = []
    kind_name = _Control.Kind.Name(kind)
    for control_input in batcher.control_input:
        if not control_input.name:
            raise invalid(f"sequence batching control tensor must have a name for {name}")
        if control_input.name in seen_tensors:
            raise invalid(f"sequence batching control tensor '{control_input.name}' is specified for multiple "
                          f"control kinds for {name}")
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            if control.kind == kind:
                if found:
                    raise invalid(f"sequence batching specifies multiple {kind_name} tensors for {name}")
                found.append(control)
    return found


def _boolean_control(batcher: ModelSequenceBatching, name: str, kind: int) -> None:
    kind_name = _Control.Kind.Name(kind)
    for control in _controls(batcher, name, kind):
        given = [(field, len(values)) for field, values in (
            ("int32_false_true", control.int32_false_true), ("fp32_false_true", control.fp32_false_true),
            ("bool_false_true", control.bool_false_true)) if values]
        if not given:
            raise invalid("sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                          f"'bool_false_true' for {kind_name} for {name}")
        if len(given) > 1:
            raise invalid("sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
                          f"and 'bool_false_true' for {kind_name} for {name}")
        field, count = given[0]
        if count != 2:
            raise invalid(f"sequence batching control '{field}' must have exactly 2 entries for {kind_name} "
                          f"for {name}")


def _typed_control(batcher: ModelSequenceBatching, name: str, kind: int) -> _Control | None:
    controls = _controls(batcher, name, kind)
    for control in controls:
        if control.int32_false_true or control.fp32_false_true or control.bool_false_true:
            raise invalid("sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                          f"'bool_false_true' for {_Control.Kind.Name(kind)} for {name}")
    return controls[0] if controls else None


# ---- ValidateInstanceGroup -----------------------------------------------------------------

def validate_instance_groups(config: ModelConfig) -> None:
    """Triton's ``ValidateInstanceGroup`` for a CPU build (GPU groups are checked against the
    visible GPUs when the instances are created)."""
    if config.HasField("ensemble_scheduling"):
        return
    name = config.name
    if not config.instance_group:
        raise invalid(f"must specify one or more 'instance group's for {name}")
    for group in config.instance_group:
        where = f"instance group {group.name} of model {name}"
        if group.kind == ModelInstanceGroup.KIND_MODEL and group.gpus:
            raise invalid(f"{where} has kind KIND_MODEL but specifies one or more GPUs")
        if group.kind == ModelInstanceGroup.KIND_CPU and group.gpus:
            raise invalid(f"{where} has kind KIND_CPU but specifies one or more GPUs")
        if group.profile and config.platform != TENSORRT_PLATFORM:
            # Triton's text lacks a space before "specifies": kept as it is.
            raise invalid(f"{where} and platform {config.platform}specifies profile field which is only "
                          "supported for TensorRT models")
        for profile in group.profile:
            if not profile.isdigit():
                raise invalid(f"{where} and platform {config.platform} specifies invalid profile {profile}. The "
                              "field should contain the string representation of a non-negative integer.")


# ---- ValidateModelIOConfig -----------------------------------------------------------------

def validate_model_io(config: ModelConfig) -> None:
    """Triton's ``ValidateModelIOConfig``: every input and output, then batch inputs and outputs;
    each message ends with `` for <model>``."""
    try:
        for tensor in config.input:
            _validate_input(tensor, config.max_batch_size, config.platform)
        for output in config.output:
            _validate_shape(output, config.max_batch_size, "model output ")
            _validate_tensor_kind(output, config.platform, "output")
        _validate_batch_io(config)
    except ServerError as error:
        raise ServerError(f"{error.message} for {config.name}", error.status) from None


def _validate_input(tensor: ModelInput, max_batch_size: int, platform: str) -> None:
    _validate_shape(tensor, max_batch_size, "model input ")
    if tensor.format in (ModelInput.FORMAT_NHWC, ModelInput.FORMAT_NCHW) and len(tensor.dims) != 3:
        raise invalid("model input NHWC/NCHW require 3 dims")
    _validate_tensor_kind(tensor, platform, "input")


def _validate_tensor_kind(tensor: _Tensor, platform: str, io_type: str) -> None:
    if platform != TENSORRT_PLATFORM and tensor.is_shape_tensor:
        raise invalid("shape tensors are only supported for TensorRT platform")
    if tensor.is_non_linear_format_io:
        if platform != TENSORRT_PLATFORM:
            raise invalid("Non-linear IO format is only supported for the TensorRT platform")
        if len(tensor.dims) != 3:
            raise invalid(f"Non-linear IO format {io_type} requires 3 dims")


def _validate_shape(tensor: _Tensor, max_batch_size: int, prefix: str) -> None:
    if not tensor.name:
        raise invalid(f"{prefix}must specify 'name'")
    prefix = f"{prefix}'{tensor.name}' "
    if tensor.data_type == DataType.TYPE_INVALID:
        raise invalid(f"{prefix}must specify 'data_type'")
    if not tensor.dims:
        raise invalid(f"{prefix}must specify 'dims'")
    has_reshape = tensor.HasField("reshape")
    shape = list(tensor.reshape.shape)
    if has_reshape and not shape and max_batch_size == 0:
        raise invalid(f"{prefix}cannot have empty reshape for non-batching model as scalar tensors are not supported")
    if any(dim < 1 and dim != WILDCARD_DIM for dim in tensor.dims):
        raise invalid(f"{prefix}dimension must be integer >= 1, or {WILDCARD_DIM} to indicate a variable-size "
                      "dimension")
    if not has_reshape:
        return
    if any(dim < 1 and dim != WILDCARD_DIM for dim in shape):
        raise invalid(f"{prefix}reshape dimensions must be integer >= 1, or {WILDCARD_DIM} to indicate a "
                      "variable-size dimension")
    dims_size, reshape_size = _element_count(tensor.dims), _element_count(shape)
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        raise invalid(f"{prefix}has different size for dims and reshape")
    if dims_size == WILDCARD_DIM:
        dims_chunks, shape_chunks = _chunks(tensor.dims), _chunks(shape)
        if len(dims_chunks) != len(shape_chunks):
            raise invalid(f"{prefix}has different number of variable-size dimensions for dims and reshape")
        if dims_chunks != shape_chunks:
            raise invalid(f"{prefix}has different size for dims and reshape")


def _element_count(dims: Sequence[int]) -> int:
    """Triton's GetElementCount: -1 when any dim is variable; 0 for no dims."""
    if not dims:
        return 0
    count = 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            return WILDCARD_DIM
        count *= dim
    return count


def _chunks(dims: Sequence[int]) -> list[int]:
    """Element counts of the runs of fixed dims between variable-size ones."""
    chunks, current = [], 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            chunks.append(current)
            current = 1
        else:
            current *= dim
    return [*chunks, current]


def _validate_batch_io(config: ModelConfig) -> None:
    inputs = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    for batch_input in config.batch_input:
        kind = BatchInput.Kind.Name(batch_input.kind)
        if len(batch_input.source_input) != 1:
            raise invalid(f"batch input kind '{kind}' expects 1 source input, got {len(batch_input.source_input)}")
        if batch_input.data_type not in (DataType.TYPE_INT32, DataType.TYPE_FP32):
            raise invalid("batch input data type must be TYPE_INT32 or TYPE_FP32")
        _known_sources(batch_input.source_input, inputs)
    for batch_output in config.batch_output:
        kind = BatchOutput.Kind.Name(batch_output.kind)
        if len(batch_output.source_input) != 1:
            raise invalid(f"batch output kind '{kind}' expects 1 source input, got "
                          f"{len(batch_output.source_input)}")
        _known_sources(batch_output.source_input, inputs)
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                raise invalid(f"unknown target output name '{target}'")
            if target in targets:
                raise invalid(f"target output name '{target}' can only be specified once")
            targets.add(target)


def _known_sources(sources: Sequence[str], inputs: set[str]) -> None:
    for source in sources:
        if source not in inputs:
            raise invalid(f"unknown source input name '{source}'")


# ---- beyond Triton -------------------------------------------------------------------------

def _validate_beyond_triton(config: ModelConfig, model_dir: Path | None) -> None:
    """Checks Triton does not make at load, where a bad value would fail every request later or
    crash a scheduler: duplicate tensor names, version policies that select nothing, state and
    rate-limiter entries without names, missing label files."""
    name = config.name
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for tensor in tensors:
            if tensor.name in seen:
                raise invalid(f"model {kind} '{tensor.name}' is declared more than once for {name}")
            seen.add(tensor.name)
            label = getattr(tensor, "label_filename", "")
            if label and model_dir is not None and not (model_dir / label).is_file():
                raise invalid(f"label file '{label}' of model output '{tensor.name}' does not exist for {name}")
    policy = config.version_policy
    if policy.WhichOneof("policy_choice") == "latest" and policy.latest.num_versions < 1:
        raise invalid(f"version_policy latest num_versions must be >= 1 for {name}")
    if policy.WhichOneof("policy_choice") == "specific" and (
            not policy.specific.versions or any(v < 1 for v in policy.specific.versions)):
        raise invalid(f"version_policy specific versions must list versions >= 1 for {name}")
    for state in config.sequence_batching.state:
        if not state.input_name or not state.output_name:
            raise invalid(f"sequence batching state must specify 'input_name' and 'output_name' for {name}")
        if state.data_type == DataType.TYPE_INVALID:
            raise invalid(f"sequence batching state '{state.input_name}' must specify 'data_type' for {name}")
    for group in config.instance_group:
        for resource in group.rate_limiter.resources:
            if not resource.name:
                raise invalid(f"instance group {group.name} of model {name} has a rate limiter resource "
                              "without a name")
        if any(gpu < 0 for gpu in group.gpus):
            raise invalid(f"instance group {group.name} of model {name} specifies invalid or unsupported gpu id "
                          f"{min(group.gpus)}")
