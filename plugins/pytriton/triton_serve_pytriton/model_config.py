"""PyTriton's model configuration dataclasses (``pytriton.model_config``), and their translation into
Triton's ``ModelConfig`` message."""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format

from triton_serve.worker import ModelConfig as TritonConfigMessage
from triton_serve.worker import datatype_of

from .exceptions import PyTritonBadParameterError, PyTritonModelConfigError, PyTritonValidationError


class DeviceKind(enum.Enum):
    """Where a model's instances run (``instance_group.kind``)."""

    KIND_AUTO = "KIND_AUTO"
    KIND_CPU = "KIND_CPU"
    KIND_GPU = "KIND_GPU"


class TimeoutAction(enum.Enum):
    """What happens to a request whose queue timeout passes."""

    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclasses.dataclass
class QueuePolicy:
    """A dynamic batcher's queue policy (``ModelQueuePolicy``)."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclasses.dataclass
class DynamicBatcher:
    """The dynamic batcher's settings (``dynamic_batching``)."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: list[int] | None = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: dict[int, QueuePolicy] | None = None


@dataclasses.dataclass
class ModelConfig:
    """How a bound function is served: batching (``max_batch_size``, ``batcher``), decoupled (streaming)
    responses and the response cache."""

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: list[Any] | None = None


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A model input or output: ``shape`` without the batch dimension (-1: any size), ``dtype`` a numpy
    type (``bytes``, ``np.bytes_`` or ``object`` for BYTES), ``name`` (default ``INPUT_<n>`` /
    ``OUTPUT_<n>``), ``optional`` (inputs only)."""

    shape: tuple[int, ...]
    dtype: Any
    name: str | None = None
    optional: bool | None = False

    def __post_init__(self) -> None:
        if isinstance(self.dtype, np.dtype):
            object.__setattr__(self, "dtype", self.dtype.type)


@dataclasses.dataclass
class TensorSpec:
    """A named input or output of a bound model, as its function's decorators see it."""

    name: str
    shape: tuple[int, ...]
    dtype: Any
    optional: bool | None = False


@dataclasses.dataclass
class TritonModelConfig:
    """What ``@triton_context`` and the decorators read about the model a function is bound to."""

    model_name: str
    model_version: int = 1
    max_batch_size: int = 4
    batching: bool = True
    batcher: DynamicBatcher | None = None
    instance_group: dict[DeviceKind, int | None] = dataclasses.field(default_factory=dict)
    decoupled: bool = False
    backend_parameters: dict[str, str] = dataclasses.field(default_factory=dict)
    inputs: Sequence[TensorSpec] | None = None
    outputs: Sequence[TensorSpec] | None = None
    response_cache: bool = False

    @property
    def backend(self) -> str:
        """The backend that serves bound functions."""
        return "pytriton"


def is_bytes_dtype(dtype: Any) -> bool:
    """Whether a Tensor's dtype stands for Triton's BYTES."""
    return dtype in (object, np.object_, bytes, np.bytes_, str, np.str_)


def config_type(dtype: Any) -> str:
    """The ``TYPE_*`` name of a Tensor's dtype."""
    if is_bytes_dtype(dtype):
        return "TYPE_STRING"
    try:
        name = datatype_of(np.empty(0, dtype=dtype))
    except (TypeError, ValueError):
        raise PyTritonValidationError(f"dtype {dtype!r} has no Triton datatype") from None
    return f"TYPE_{name}"


def tensor_specs(tensors: Sequence[Tensor], prefix: str) -> list[TensorSpec]:
    """The named specs of ``tensors`` (unnamed ones get ``<prefix>_<n>``, counted from 1)."""
    specs = []
    for index, tensor in enumerate(tensors, start=1):
        if not isinstance(tensor, Tensor):
            raise PyTritonValidationError(f"{prefix.lower()}s must be Tensor objects, got {tensor!r}")
        specs.append(TensorSpec(tensor.name or f"{prefix}_{index}", tuple(tensor.shape), tensor.dtype,
                                tensor.optional))
    names = [spec.name for spec in specs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise PyTritonValidationError(f"{prefix.lower()} names must be unique; repeated: {', '.join(repeated)}")
    return specs


def triton_model_config(name: str, version: int, config: ModelConfig, inputs: Sequence[Tensor],
                        outputs: Sequence[Tensor], instances: int) -> TritonModelConfig:
    """The model a bind describes."""
    if any(tensor.optional for tensor in outputs):
        raise PyTritonValidationError("Output tensors cannot be optional.")
    if config.batching and config.max_batch_size < 1:
        raise PyTritonBadParameterError("The `max_batch_size` must be greater or equal to 1.")
    return TritonModelConfig(
        model_name=name, model_version=version, max_batch_size=config.max_batch_size if config.batching else 0,
        batching=config.batching, batcher=config.batcher, instance_group={DeviceKind.KIND_CPU: instances},
        decoupled=config.decoupled, inputs=tensor_specs(inputs, "INPUT"), outputs=tensor_specs(outputs, "OUTPUT"),
        response_cache=config.response_cache)


def _queue_policy(policy: QueuePolicy) -> dict[str, Any]:
    return {"timeout_action": policy.timeout_action.value,
            "default_timeout_microseconds": int(policy.default_timeout_microseconds),
            "allow_timeout_override": policy.allow_timeout_override, "max_queue_size": int(policy.max_queue_size)}


def to_message(model: TritonModelConfig) -> dict[str, Any]:
    """Triton's JSON model config for ``model`` (``backend: "pytriton"``), as PyTriton generates it."""
    config: dict[str, Any] = {"name": model.model_name, "backend": model.backend,
                              "max_batch_size": model.max_batch_size}
    batcher = model.batcher
    if model.batching and isinstance(batcher, DynamicBatcher):
        batching: dict[str, Any] = {}
        if batcher.max_queue_delay_microseconds > 0:
            batching["max_queue_delay_microseconds"] = int(batcher.max_queue_delay_microseconds)
        if batcher.preferred_batch_size:
            batching["preferred_batch_size"] = [int(size) for size in batcher.preferred_batch_size]
        if batcher.preserve_ordering:
            batching["preserve_ordering"] = True
        if batcher.priority_levels:
            batching["priority_levels"] = batcher.priority_levels
        if batcher.default_priority_level:
            if batcher.default_priority_level > batcher.priority_levels:
                raise PyTritonBadParameterError(
                    f"The `default_priority_level` must be between 1 and {batcher.priority_levels}.")
            batching["default_priority_level"] = batcher.default_priority_level
        if batcher.default_queue_policy:
            batching["default_queue_policy"] = _queue_policy(batcher.default_queue_policy)
        if batcher.priority_queue_policy:
            if not batcher.priority_levels:
                raise PyTritonBadParameterError("Provide the `priority_levels` if you want to define "
                                                "`priority_queue_policy` for Dynamic Batching.")
            batching["priority_queue_policy"] = {str(level): _queue_policy(policy)
                                                 for level, policy in batcher.priority_queue_policy.items()}
        config["dynamic_batching"] = batching

    def describe(spec: TensorSpec) -> dict[str, Any]:
        described: dict[str, Any] = {"name": spec.name, "data_type": config_type(spec.dtype), "dims": list(spec.shape)}
        if spec.optional:
            described["optional"] = True
        return described

    config["input"] = [describe(spec) for spec in model.inputs or ()]
    config["output"] = [describe(spec) for spec in model.outputs or ()]
    config["instance_group"] = [{"count": count, "kind": kind.value} for kind, count in model.instance_group.items()]
    if model.decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    if model.response_cache:
        config["response_cache"] = {"enable": True}
    return config


def to_config_message(model: TritonModelConfig) -> TritonConfigMessage:
    """``to_message`` as a ``ModelConfig`` protobuf message."""
    try:
        return json_format.ParseDict(to_message(model), TritonConfigMessage())
    except json_format.ParseError as error:
        raise PyTritonModelConfigError(f"model '{model.model_name}': {error}") from None

__all__ = ["DeviceKind", "DynamicBatcher", "ModelConfig", "QueuePolicy", "Tensor", "TensorSpec", "TimeoutAction",
           "TritonModelConfig"]
