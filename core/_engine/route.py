"""What every request to one model version needs, resolved once at the version's first request:
input checks with Triton's messages, reshape, and the shaping of outputs back to the client."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .datatypes import BY_NAME, element_count, name_of_config_type
from .errors import ServerError, internal
from .inference import RESERVED_PARAMETERS, InferenceRequest, InferenceResponse, Tensor

if TYPE_CHECKING:
    from .protos.model_config_pb2 import ModelConfig

_NOTHING_REQUESTED: dict[str, Any] = {}  # never written: a request without "outputs" asks for all of them


@dataclass(frozen=True, slots=True)
class TensorRule:
    """One declared input or output: its datatype name, dims past the batch dimension, and reshape."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool
    reshape: tuple[int, ...] | None

    def matches(self, shape: tuple[int, ...]) -> bool:
        return shape == self.dims or _fits(shape, self.dims)  # equal: the common case, without a generator


def _quoted(names: Iterable[str]) -> str:
    """Names as Triton lists them in messages: ``['a','b']``."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def _fits(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims))


def _rule(spec: Any, optional: bool = False) -> TensorRule:
    reshape = tuple(spec.reshape.shape) if spec.HasField("reshape") else None
    return TensorRule(spec.name, name_of_config_type(spec.data_type), tuple(spec.dims), optional, reshape)


class ModelRoute:
    """Per model version: ``validate`` a request before it is scheduled, ``shape`` each response after."""

    def __init__(self, name: str, config: ModelConfig, labels: dict[str, list[str]]) -> None:
        self.name = name
        self.max_batch_size = config.max_batch_size
        self.batching = config.max_batch_size > 0
        self.decoupled = config.model_transaction_policy.decoupled
        self.cacheable = config.response_cache.enable
        self.inputs = {spec.name: _rule(spec, spec.optional) for spec in config.input}
        self.required = [n for n, rule in self.inputs.items() if not rule.optional]
        self.outputs = {spec.name: _rule(spec) for spec in config.output}
        self.labels = labels

    # ---- requests -------------------------------------------------------------------------------

    def validate(self, request: InferenceRequest) -> None:
        """Check inputs and requested outputs against the config (Triton's messages); apply reshape."""
        name = self.name
        if request.parameters and not RESERVED_PARAMETERS.isdisjoint(request.parameters):
            apply_reserved_parameters(request)
        declared = self.inputs
        for input_name in request.inputs:
            if input_name not in declared:
                raise ServerError(f"unexpected inference input '{input_name}' for model '{name}'")
        missing = [n for n in self.required if n not in request.inputs]
        if missing:
            raise ServerError(self._missing_inputs(request, missing))
        batching = self.batching
        batch_size = None
        for tensor in request.inputs.values():
            rule = declared[tensor.name]
            if tensor.datatype != rule.datatype:
                raise ServerError(f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                                  f"but model '{name}' expects '{rule.datatype}'")
            shape = tensor.shape
            if batching:
                if not shape:
                    raise ServerError(f"inference input '{tensor.name}' for model '{name}' has no batch "
                                      f"dimension; expected shape {[-1, *rule.dims]}")
                if not 1 <= shape[0] <= self.max_batch_size:
                    raise ServerError(f"inference request batch-size must be <= {self.max_batch_size} "
                                      f"for '{name}', got {shape[0]} for input '{tensor.name}'")
                if batch_size is not None and shape[0] != batch_size:
                    raise ServerError(f"inputs of a request to model '{name}' must share one batch size; "
                                      f"input '{tensor.name}' has {shape[0]}, another has {batch_size}")
                batch_size = shape[0]
                shape = shape[1:]
            if not rule.matches(shape):
                expected = [-1, *rule.dims] if batching else list(rule.dims)
                raise ServerError(f"unexpected shape for input '{tensor.name}' for model '{name}'. "
                                  f"Expected {expected}, got {list(tensor.shape)}")
            if rule.reshape is not None:
                prefix = tensor.shape[:1] if batching else ()
                tensor.reshape(prefix + rule.reshape)
        for output in request.outputs:
            if output.name not in self.outputs:
                raise ServerError(f"unexpected inference output '{output.name}' for model '{name}'")

    def _missing_inputs(self, request: InferenceRequest, missing: list[str]) -> str:
        """Triton's message for required inputs a request lacks; a model with optional inputs states the
        range of input counts it takes."""
        total, required = len(self.inputs), len(self.required)
        expected = f"expected {total} inputs" if total == required else \
            f"expected number of inputs between {required} and {total}"
        return (f"{expected} but got {len(request.inputs)} inputs for model '{self.name}'. Got input(s) "
                f"{_quoted(request.inputs)}, but missing required input(s) {_quoted(missing)}. "
                "Please provide all required input(s).")

    # ---- responses ------------------------------------------------------------------------------

    def shape(self, request: InferenceRequest, response: InferenceResponse) -> InferenceResponse:
        """Keep only the requested outputs (those returned), check them against the config, undo reshape,
        classify."""
        wanted = {o.name: o for o in request.outputs} if request.outputs else _NOTHING_REQUESTED
        batching = self.batching
        outputs: list[Tensor] = []
        for tensor in response.outputs:
            if wanted and tensor.name not in wanted:
                continue
            rule = self.outputs.get(tensor.name)
            if rule is None:
                raise internal(f"model '{request.model_name}' returned output '{tensor.name}', "
                               "which its config does not declare")
            if tensor.datatype != rule.datatype:
                if tensor.size:
                    raise internal(f"model '{request.model_name}' returned output '{tensor.name}' with datatype "
                                   f"'{tensor.datatype}', but its config declares '{rule.datatype}'")
                # No element to misread (an LLM that stops at once returns np.array([]), float64, for a text
                # output): Triton passes it, and it takes its config's datatype here.
                tensor = Tensor(tensor.name, rule.datatype, tensor.shape,
                                np.empty(tensor.shape, BY_NAME[rule.datatype].numpy), tensor.parameters)
            # Triton's core checks no output shape against the config (nor does its python backend): any shape
            # goes through, except that an output whose config has ``reshape`` must hold its config dims' elements.
            if rule.reshape is not None and (tensor.shape or not batching) and -1 not in rule.dims:
                prefix = tensor.shape[:1] if batching else ()
                if element_count(prefix + rule.dims) != tensor.size:
                    raise internal(f"model '{request.model_name}' returned output '{tensor.name}' with shape "
                                   f"{list(tensor.shape)}, which cannot be reshaped to its config dims "
                                   f"{([-1] if batching else []) + list(rule.dims)}")
                tensor.reshape(prefix + rule.dims)
            if tensor.wire is None and element_count(tensor.shape) != tensor.size:  # wire bytes were counted
                raise internal(f"model '{request.model_name}' returned output '{tensor.name}' whose data holds "
                               f"{tensor.size} elements for shape {list(tensor.shape)}")
            requested = wanted.get(tensor.name)
            if requested is not None and "classification" in requested.parameters:
                tensor = classify(tensor, requested.parameters["classification"], self.labels.get(tensor.name),
                                  batching)
            elif requested is not None:
                tensor.parameters = dict(requested.parameters)
            outputs.append(tensor)
        # A requested output the model did not return is left out of the response, as in Triton (whose
        # ensembles then run the next step without it).
        response.outputs = outputs
        return response


def apply_reserved_parameters(request: InferenceRequest) -> None:
    """Move the reserved request parameters (sequence, priority, timeout) into request fields."""
    params = request.parameters
    try:
        sequence_id = params.get("sequence_id", 0)
        if not isinstance(sequence_id, str):
            sequence_id = _as_uint(sequence_id, "sequence_id", "an unsigned integer or a string")
        request.sequence_id = sequence_id
        request.sequence_start = _as_bool(params.get("sequence_start", False), "sequence_start")
        request.sequence_end = _as_bool(params.get("sequence_end", False), "sequence_end")
        request.priority = _as_uint(params.get("priority", 0), "priority")
        request.timeout_us = _as_uint(params.get("timeout", 0), "timeout")
    except TypeError as error:
        raise ServerError(f"invalid request parameter for model '{request.model_name}': {error}") from None


def _as_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a boolean")
    return value


def _as_uint(value: Any, name: str, kind: str = "an unsigned integer") -> int:
    """``value`` if it is an unsigned 64-bit integer (what Triton reads these parameters as)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
        raise TypeError(f"{name} must be {kind}")
    return value


# The most elements of one (batch entry of an) output that classification sorts, as Triton 2.66 bounds it.
MAX_CLASSIFICATION_ELEMENTS = 1_000_000


def classify(tensor: Tensor, count: Any, labels: list[str] | None, batching: bool) -> Tensor:
    """Triton's classification extension: the top ``count`` values as "value:index[:label]" strings."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ServerError(f"classification count for output '{tensor.name}' must be a positive integer")
    if tensor.datatype == "BYTES":
        raise ServerError(f"output '{tensor.name}' holds BYTES and cannot be classified")
    rows = tensor.data.reshape((tensor.shape[0], -1)) if batching else tensor.data.reshape((1, -1))
    if rows.shape[1] > MAX_CLASSIFICATION_ELEMENTS:  # Triton 2.66: per batch entry, before any sorting
        raise ServerError("classification output tensor too large")
    k = min(count, rows.shape[1])
    result = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows):
        for c, index in enumerate(np.argsort(-row.astype(np.float64), kind="stable")[:k]):
            value = row[index]
            text = f"{value:f}" if np.issubdtype(row.dtype, np.floating) else str(value)
            text += f":{index}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            result[r, c] = text.encode()
    shape = tuple(result.shape) if batching else (k,)
    return Tensor(tensor.name, "BYTES", shape, result.reshape(shape), {})
