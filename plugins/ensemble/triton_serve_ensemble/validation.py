"""Triton's ensemble config checks, with its messages: the step graph alone (when the config is read)
and the steps against their models' configs (when the ensemble loads)."""
from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from triton_serve.plugin import DataType, ModelConfig, ServerError, Status

ENSEMBLE_PLATFORM = "ensemble"


def invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


# ---- ValidateEnsembleSchedulingConfig (model_config_utils.cc) -------------------------------

@dataclass(eq=False)
class _GraphTensor:
    name: str
    is_output: bool
    ready: bool = False
    prev: list[_GraphTensor] = field(default_factory=list)
    next: list[_GraphTensor] = field(default_factory=list)


def _build_graph(config: ModelConfig) -> dict[str, _GraphTensor]:
    """Triton's ``BuildEnsembleGraph``: one node per ensemble tensor, linked from each step's inputs
    to its outputs."""
    tensors: dict[str, _GraphTensor] = {}
    name = config.name
    for index, step in enumerate(config.ensemble_scheduling.step):
        for field_name, value in (("model_name", step.model_name), ("input_map", step.input_map),
                                  ("output_map", step.output_map)):
            if not value:
                raise invalid(f"must specify '{field_name}' in step {index} of ensemble '{name}'")
        produced = []
        for tensor_name in step.output_map.values():
            node = tensors.get(tensor_name)
            if node is None:
                node = tensors[tensor_name] = _GraphTensor(tensor_name, True)
            elif node.is_output:
                raise invalid(f"ensemble tensor '{tensor_name}' can appear in an output map only once for "
                              f"ensemble '{name}' step {index}")
            else:
                node.is_output = True
            produced.append(node)
        for tensor_name in step.input_map.values():  # a map's keys are unique: Triton's duplicate check cannot fire
            node = tensors.setdefault(tensor_name, _GraphTensor(tensor_name, False))
            for output in produced:
                output.prev.append(node)
                node.next.append(output)
    return tensors


def check_scheduling(config: ModelConfig) -> None:
    """Triton's ``ValidateEnsembleSchedulingConfig``: raise INVALID_ARG with its message when the
    ensemble's steps cannot produce its outputs from its inputs."""
    name = config.name
    if config.platform != ENSEMBLE_PLATFORM:
        raise invalid(f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
                      f"{ENSEMBLE_PLATFORM}")
    if config.instance_group:
        raise invalid(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise invalid(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise invalid(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise invalid(f"must specify 'step' for ensemble '{name}'")
    tensors = _build_graph(config)
    ready: deque[_GraphTensor] = deque()
    for tensor in config.input:
        node = tensors.get(tensor.name)
        if node is None:
            raise invalid(f"ensemble input '{tensor.name}' for ensemble {name}' is not used")  # Triton's quotes
        node.ready = True
        ready.append(node)
    while ready:
        for following in ready.popleft().next:
            if not following.ready and all(p.ready for p in following.prev):
                following.ready = True
                ready.append(following)
    outputs = set()
    for output in config.output:
        node = tensors.get(output.name)
        if node is None:
            raise invalid(f"ensemble output '{output.name}' for ensemble {name}' is not used")
        if not node.ready:
            raise invalid(f"output '{output.name}' for ensemble '{name}' is not written" + _unconnected(node))
        outputs.add(output.name)
    for tensor_name, node in tensors.items():
        if tensor_name not in outputs and (not node.ready or not node.next):
            raise invalid(f"ensemble tensor '{tensor_name}' is unused in ensemble '{name}'")


def _unconnected(node: _GraphTensor) -> str:
    """Triton's hint: the furthest not-ready tensor upstream of ``node`` (cycles stop the walk)."""
    last, seen, previous = node, set(), node.prev
    while previous:
        candidates, previous = previous, []
        for candidate in candidates:
            if not candidate.ready and candidate.name not in seen:
                seen.add(candidate.name)
                last, previous = candidate, candidate.prev
                break
    if last is node:
        return ""
    return f": at least one of its depending tensors, '{last.name}', is not connected"


# ---- ValidateEnsembleConfig (ensemble_utils.cc) ----------------------------------------------

@dataclass(eq=False)
class _TypedTensor:
    model: str
    datatype: int
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]
    decoupled: bool = False
    label: int = 0
    visited: bool = False
    sibling: _TypedTensor | None = None
    prev: list[_TypedTensor] = field(default_factory=list)
    next: list[_TypedTensor] = field(default_factory=list)


def _typed(model: str, batching: bool, datatype: int, dims: Any) -> _TypedTensor:
    dims = tuple(dims)
    return _TypedTensor(model, datatype, dims, ((-1,) if batching else ()) + dims)


def _symbol(model: str) -> _TypedTensor:
    return _TypedTensor(model, DataType.TYPE_INVALID, (), ())


def _dims_match(left: tuple[int, ...], right: tuple[int, ...]) -> bool:
    return len(left) == len(right) and all(a == b or a == -1 or b == -1 for a, b in zip(left, right))


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _consistent(left: _TypedTensor, right: _TypedTensor, prefix: str) -> None:
    if left.datatype != right.datatype:
        raise invalid(f"{prefix}inconsistent data type: {DataType.Name(left.datatype)} is inferred from model "
                      f"{left.model} while {DataType.Name(right.datatype)} is inferred from model {right.model}")
    if not _dims_match(left.dims, right.dims) and not _dims_match(left.full_dims, right.full_dims):
        raise invalid(f"{prefix}inconsistent shape: {_dims_text(left.full_dims)} is inferred from model "
                      f"{left.model} while {_dims_text(right.full_dims)} is inferred from model {right.model}")


def _map_step(ensemble: str, step: Any, config: ModelConfig, tensors: dict[str, _TypedTensor]) -> None:
    """Triton's ``ValidateTensorMapping`` for one step."""
    model, batching = step.model_name, config.max_batch_size > 0
    inputs = {tensor.name: tensor for tensor in config.input}
    for model_input, tensor_name in step.input_map.items():
        if model_input not in inputs:
            raise invalid(f"in ensemble {ensemble}, ensemble tensor {tensor_name} is mapping to non-existing "
                          f"input {model_input} in model {model}")
    for model_input in config.input:
        tensor_name = step.input_map.get(model_input.name)
        if tensor_name is None:
            if model_input.optional:
                continue
            raise invalid(f"in ensemble {ensemble}, input {model_input.name} in model {model} is not mapped "
                          "to any ensemble tensors")
        node = _typed(model, batching, model_input.data_type, model_input.dims)
        if tensor_name in tensors:
            _consistent(tensors[tensor_name], node, f"in ensemble {ensemble}, ensemble tensor {tensor_name}: ")
        else:
            tensors[tensor_name] = node
    outputs = {tensor.name: tensor for tensor in config.output}
    for model_output, tensor_name in step.output_map.items():
        if model_output not in outputs:
            raise invalid(f"in ensemble {ensemble}, ensemble tensor {tensor_name} is mapped from non-existing "
                          f"output {model_output} in model {model}")
    sibling = _symbol(model)
    for model_output, tensor_name in step.output_map.items():
        spec = outputs[model_output]
        node = _typed(model, batching, spec.data_type, spec.dims)
        if tensor_name in tensors:
            _consistent(tensors[tensor_name], node, f"in ensemble {ensemble}, ensemble tensor {tensor_name}: ")
        else:
            tensors[tensor_name] = node
        tensors[tensor_name].sibling = sibling
    decoupled = config.model_transaction_policy.decoupled
    for tensor_name in step.output_map.values():
        node = tensors[tensor_name]
        node.decoupled = decoupled
        for source in step.input_map.values():
            node.prev.append(tensors[source])
            tensors[source].next.append(node)


def check_steps(config: ModelConfig, composing: Mapping[str, ModelConfig]) -> bool:
    """Triton's ``ValidateEnsembleConfig``: the steps against the completed configs of their models
    (``composing``, by model name). Returns whether the ensemble is decoupled (some step's model is)."""
    ensemble, batching = config.name, config.max_batch_size > 0
    tensors: dict[str, _TypedTensor] = {}
    for tensor in config.input:
        dims = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
        tensors[tensor.name] = _typed(ensemble, batching, tensor.data_type, dims)
    sink = _symbol(ensemble)
    for output in config.output:
        dims = output.reshape.shape if output.HasField("reshape") else output.dims
        node = tensors.setdefault(output.name, _typed(ensemble, batching, output.data_type, dims))
        sink.prev.append(node)
        node.next.append(sink)
    for step in config.ensemble_scheduling.step:
        model_config = composing[step.model_name]
        if 0 < model_config.max_batch_size < config.max_batch_size:
            raise invalid(f"ensemble {ensemble} allows maximum batch size {config.max_batch_size}, but it contains "
                          f"model {step.model_name} which only allows maximum batch size to be "
                          f"{model_config.max_batch_size}")
        _map_step(ensemble, step, model_config, tensors)
    return _decoupled_labels(ensemble, config, tensors) != 0


def _decoupled_labels(ensemble: str, config: ModelConfig, tensors: dict[str, _TypedTensor]) -> int:
    """Walk the data flow labelling tensors by the decoupled step they descend from; a step may not
    mix tensors of two labels. Returns the number of decoupled labels."""
    label = 0
    current: deque[_TypedTensor] = deque()
    for tensor in config.input:
        node = tensors[tensor.name]
        node.visited = True
        current.append(node)
    while current:
        for following in current.popleft().next:
            if following.visited or not all(p.visited for p in following.prev):
                continue
            previous_label = following.prev[0].label
            if any(p.label != previous_label for p in following.prev):
                raise invalid(f"in ensemble {ensemble}, step of model '{following.model}' receives inputs "
                              "originated from different decoupled models")
            sibling = following.sibling
            if sibling is not None and sibling.visited:
                following.label = sibling.label
            else:
                if following.decoupled:
                    label += 1
                following.label = label if following.decoupled else previous_label
                if sibling is not None:
                    sibling.label, sibling.visited = following.label, True
            following.visited = True
            current.append(following)
    return label
