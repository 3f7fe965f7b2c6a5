"""Triton's rules for a model configuration; each error names the model and the field."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import ServerError
from .protos.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelDynamicBatching,
    ModelInstanceGroup,
    ModelQueuePolicy,
    ModelSequenceBatching,
)

_CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")


class _Checker:
    def __init__(self, config: ModelConfig) -> None:
        self.config = config

    def fail(self, field: str, problem: str) -> None:
        raise ServerError(f"invalid model config for '{self.config.name}': {field}: {problem}")

    def check(self, ok: bool, field: str, problem: str) -> None:
        if not ok:
            self.fail(field, problem)


def validate_config(config: ModelConfig, model_dir: Path | None = None) -> None:
    """Raise ServerError on the first rule the (defaulted, auto-completed) config breaks."""
    c = _Checker(config)
    c.check(config.max_batch_size >= 0, "max_batch_size", f"must be >= 0, got {config.max_batch_size}")
    c.check(bool(config.backend or config.platform), "backend",
            "must specify 'platform' or 'backend' (or a model file a backend can recognize)")
    _check_tensors(c, config, model_dir)
    _check_instance_groups(c, config.instance_group)
    _check_version_policy(c, config)
    if config.HasField("dynamic_batching"):
        _check_dynamic_batching(c, config.dynamic_batching, config.max_batch_size)
    if config.HasField("sequence_batching"):
        _check_sequence_batching(c, config.sequence_batching)
    if config.response_cache.enable:
        c.check(not config.HasField("sequence_batching"), "response_cache",
                "cannot be enabled for a model with sequence_batching")
        c.check(not config.model_transaction_policy.decoupled, "response_cache",
                "cannot be enabled for a decoupled model")


def _check_dims(c: _Checker, field: str, dims: Sequence[int], batching: bool) -> None:
    c.check(all(d == -1 or d > 0 for d in dims), f"{field}.dims",
            f"each dim must be positive or -1 (variable), got {list(dims)}")
    c.check(bool(dims) or batching, f"{field}.dims", "must not be empty when max_batch_size is 0")


def _check_reshape(c: _Checker, field: str, dims: Sequence[int], shape: Sequence[int]) -> None:
    c.check(all(d == -1 or d >= 0 for d in shape), f"{field}.reshape.shape",
            f"each dim must be >= 0 or -1, got {list(shape)}")
    variable_dims, variable_shape = list(dims).count(-1), list(shape).count(-1)
    fixed = lambda xs: _product(x for x in xs if x != -1)  # noqa: E731
    c.check(variable_dims == variable_shape and fixed(dims) == fixed(shape), f"{field}.reshape",
            f"shape {list(shape)} does not hold the same elements as dims {list(dims)}")


def _check_tensors(c: _Checker, config: ModelConfig, model_dir: Path | None) -> None:
    batching = config.max_batch_size > 0
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for index, tensor in enumerate(tensors):
            field = f"{kind}[{index}]"
            c.check(bool(tensor.name), field, "must specify 'name'")
            field = f"{kind} '{tensor.name}'"
            c.check(tensor.name not in seen, field, "is declared more than once")
            seen.add(tensor.name)
            c.check(tensor.data_type != 0, f"{field}.data_type", "must specify a data type other than TYPE_INVALID")
            _check_dims(c, field, tensor.dims, batching)
            if tensor.HasField("reshape"):
                _check_reshape(c, field, tensor.dims, tensor.reshape.shape)
            if kind == "input" and tensor.format != 0:
                c.check(len(tensor.dims) == 3, f"{field}.format",
                        f"an image format needs 3 dims (excluding batch), got {list(tensor.dims)}")
            label = getattr(tensor, "label_filename", "")
            if label and model_dir is not None:
                c.check((model_dir / label).is_file(), f"{field}.label_filename", f"file '{label}' does not exist")


def _check_instance_groups(c: _Checker, groups: Iterable[ModelInstanceGroup]) -> None:
    for group in groups:
        field = f"instance_group '{group.name}'"
        c.check(group.count >= 1, f"{field}.count", f"must be >= 1, got {group.count}")
        c.check(all(g >= 0 for g in group.gpus), f"{field}.gpus", f"GPU ids must be >= 0, got {list(group.gpus)}")
        if group.kind in (ModelInstanceGroup.KIND_CPU, ModelInstanceGroup.KIND_MODEL):
            c.check(not group.gpus, f"{field}.gpus",
                    f"must be empty for kind {ModelInstanceGroup.Kind.Name(group.kind)}")
        for resource in group.rate_limiter.resources:
            c.check(bool(resource.name), f"{field}.rate_limiter.resources", "each resource must have a name")
            c.check(resource.count > 0, f"{field}.rate_limiter.resources '{resource.name}'.count",
                    "must be > 0")


def _check_version_policy(c: _Checker, config: ModelConfig) -> None:
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "latest":
        c.check(policy.latest.num_versions >= 1, "version_policy.latest.num_versions",
                f"must be >= 1, got {policy.latest.num_versions}")
    elif choice == "specific":
        c.check(len(policy.specific.versions) > 0, "version_policy.specific.versions", "must list at least one version")
        c.check(all(v >= 1 for v in policy.specific.versions), "version_policy.specific.versions",
                f"versions must be >= 1, got {list(policy.specific.versions)}")


def _check_queue_policy(c: _Checker, field: str, policy: ModelQueuePolicy) -> None:
    c.check(policy.max_queue_size >= 0, f"{field}.max_queue_size", "must be >= 0")


def _check_dynamic_batching(c: _Checker, batching: ModelDynamicBatching, max_batch_size: int) -> None:
    field = "dynamic_batching"
    for size in batching.preferred_batch_size:
        c.check(size >= 1, f"{field}.preferred_batch_size", f"sizes must be >= 1, got {size}")
        c.check(max_batch_size == 0 or size <= max_batch_size, f"{field}.preferred_batch_size",
                f"size {size} exceeds max_batch_size {max_batch_size}")
    levels = batching.priority_levels
    if levels == 0:
        c.check(batching.default_priority_level == 0, f"{field}.default_priority_level",
                "must be 0 when priority_levels is not set")
    else:
        c.check(1 <= batching.default_priority_level <= levels, f"{field}.default_priority_level",
                f"must be in [1, {levels}], got {batching.default_priority_level}")
    for level in batching.priority_queue_policy:
        c.check(1 <= level <= levels, f"{field}.priority_queue_policy",
                f"level {level} is outside the priority levels [1, {levels}]")
    _check_queue_policy(c, f"{field}.default_queue_policy", batching.default_queue_policy)
    for level, policy in batching.priority_queue_policy.items():
        _check_queue_policy(c, f"{field}.priority_queue_policy[{level}]", policy)
    if batching.preserve_ordering:
        c.check(levels <= 1, f"{field}.preserve_ordering", "requires a single priority level")
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        c.check(all(p.timeout_action != ModelQueuePolicy.DELAY for p in policies), f"{field}.preserve_ordering",
                "cannot be combined with the DELAY timeout action")


def _check_sequence_batching(c: _Checker, batching: ModelSequenceBatching) -> None:
    field = "sequence_batching"
    seen_kinds: set[int] = set()
    for control_input in batching.control_input:
        c.check(bool(control_input.name), f"{field}.control_input", "each control input must have a name")
        for control in control_input.control:
            kind_name = ModelSequenceBatching.Control.Kind.Name(control.kind)
            where = f"{field}.control_input '{control_input.name}' {kind_name}"
            c.check(control.kind not in seen_kinds, where, "is specified more than once")
            seen_kinds.add(control.kind)
            if control.kind == ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
                type_name = DataType.Name(control.data_type)
                c.check(type_name in _CORRID_TYPES, f"{where}.data_type",
                        f"must be one of {', '.join(_CORRID_TYPES)}, got {type_name}")
            else:
                values = [list(control.int32_false_true), list(control.fp32_false_true),
                          list(control.bool_false_true)]
                given = [v for v in values if v]
                c.check(len(given) == 1 and len(given[0]) == 2, where,
                        "must give exactly one of int32_false_true, fp32_false_true or bool_false_true "
                        "with two values")
    for index, state in enumerate(batching.state):
        where = f"{field}.state[{index}]"
        c.check(bool(state.input_name) and bool(state.output_name), where, "must name input_name and output_name")
        c.check(state.data_type != 0, f"{where}.data_type", "must be set")


def _product(values: Iterable[int]) -> int:
    result = 1
    for value in values:
        result *= value
    return result
