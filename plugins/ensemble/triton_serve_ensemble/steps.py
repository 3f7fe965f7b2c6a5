"""An ensemble's steps, resolved once per loaded version: which tensors each step needs, which steps
follow it, which steps a set of requested outputs needs, and how step requests and responses map to
ensemble tensors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from triton_serve.plugin import (InferenceRequest, InferenceResponse, ModelConfig, RequestedOutput, ServerError,
                                 Status, Tensor)

_SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
# Request parameters that the core reads into request fields: a step request gets the fields, not these.
_FIELD_PARAMETERS = frozenset({*_SEQUENCE_PARAMETERS, "priority", "timeout"})
_MAX_CACHED_PLANS = 256  # output sets whose needed steps are remembered (there are at most 2**outputs)


class SequenceFields(NamedTuple):
    """A correlation id and the sequence flags, as a step request had them or its response set them."""

    id: int | str
    start: bool
    end: bool

    @classmethod
    def of(cls, request: InferenceRequest) -> SequenceFields:
        return cls(request.sequence_id, request.sequence_start, request.sequence_end)


@dataclass(frozen=True, slots=True)
class Slot:
    """One ensemble tensor of one request. ``tensor`` is None where it was left out: an optional ensemble
    input the request omits, or an output its step did not return (Triton's placeholder: the steps it
    feeds run without it). ``sequence`` holds the sequence fields of the step that made it (None for
    ensemble inputs); the steps it feeds and the ensemble response take them, as in Triton."""

    tensor: Tensor | None
    sequence: SequenceFields | None = None


class StepGraph:
    """The steps of one ensemble config (already validated by ``check_scheduling``)."""

    def __init__(self, config: ModelConfig) -> None:
        self.steps = list(config.ensemble_scheduling.step)
        self.batching = config.max_batch_size > 0
        self.optional = [tensor.name for tensor in config.input if tensor.optional]
        self._inputs = [dict(step.input_map) for step in self.steps]
        self._outputs = [dict(step.output_map) for step in self.steps]
        self._producer = {tensor_name: index for index, outputs in enumerate(self._outputs)
                          for tensor_name in outputs.values()}
        consumers: dict[str, set[int]] = {}
        for index, inputs in enumerate(self._inputs):
            for tensor_name in inputs.values():
                consumers.setdefault(tensor_name, set()).add(index)
        self._next = [set().union(*(consumers.get(t, set()) for t in outputs.values()))
                      for outputs in self._outputs]
        self._downstream = [self._reach(index) for index in range(len(self.steps))]
        self._plans: dict[frozenset[str], frozenset[int]] = {}

    def _reach(self, index: int) -> frozenset[int]:
        found: set[int] = set()
        pending = list(self._next[index])
        while pending:
            step = pending.pop()
            if step not in found:
                found.add(step)
                pending.extend(self._next[step])
        return frozenset(found - {index})

    def downstream(self, index: int) -> frozenset[int]:
        """The steps that use, directly or not, an output of step ``index``."""
        return self._downstream[index]

    def needed(self, outputs: frozenset[str]) -> frozenset[int]:
        """The steps that the ensemble outputs ``outputs`` depend on: those that make them, and the steps
        that feed those, and so on. Triton prunes the other steps of each request the same way."""
        plan = self._plans.get(outputs)
        if plan is None:
            found: set[int] = set()
            pending = list(outputs)
            while pending:
                index = self._producer.get(pending.pop())
                if index is not None and index not in found:
                    found.add(index)
                    pending.extend(self._inputs[index].values())
            plan = frozenset(found)
            if len(self._plans) < _MAX_CACHED_PLANS:
                self._plans[outputs] = plan
        return plan

    def initial(self, request: InferenceRequest) -> dict[str, Slot]:
        """The ensemble tensors a request starts with: its inputs, and an empty slot for each optional
        input it leaves out (a step mapping one runs without it)."""
        tensors = {name: Slot(tensor) for name, tensor in request.inputs.items()}
        for name in self.optional:
            tensors.setdefault(name, Slot(None))
        return tensors

    def is_ready(self, index: int, tensors: dict[str, Slot]) -> bool:
        """Every tensor step ``index`` maps has its slot (holding a tensor or left out)."""
        return all(t in tensors for t in self._inputs[index].values())

    def step_request(self, index: int, request: InferenceRequest, tensors: dict[str, Slot]) -> InferenceRequest:
        """The request for step ``index`` of ensemble request ``request``: its mapped tensors (no copy; those
        left out are not sent), the outputs its step maps, and the ensemble request's id, parameters (less
        those the core reads into fields), priority and timeout. Its sequence fields are the ensemble
        request's, unless a tensor it takes was made by an earlier step: then the first such tensor's (as
        Triton's ``InitStep`` does)."""
        step = self.steps[index]
        inputs = {}
        sequence = None
        for model_input, tensor_name in self._inputs[index].items():
            slot = tensors[tensor_name]
            if slot.tensor is not None:
                tensor = slot.tensor
                inputs[model_input] = Tensor(model_input, tensor.datatype, tensor.shape, tensor.data)
            if sequence is None:
                sequence = slot.sequence
        step_request = InferenceRequest(
            step_model(step), None if step.model_version == -1 else step.model_version, id=request.id,
            inputs=inputs, outputs=[RequestedOutput(name) for name in self._outputs[index]],
            parameters={k: v for k, v in request.parameters.items() if k not in _FIELD_PARAMETERS})
        step_request.priority = request.priority
        step_request.timeout_us = request.timeout_us
        if sequence is None:
            sequence = SequenceFields.of(request)
        step_request.sequence_id, step_request.sequence_start, step_request.sequence_end = sequence
        return step_request

    def step_outputs(self, index: int, response: InferenceResponse, sequence: SequenceFields) -> dict[str, Slot]:
        """The ensemble tensors in one response of step ``index``, whose request had ``sequence``: a slot for
        each output its step maps, empty where the response left the output out. The response's
        ``sequence_id``/``sequence_start``/``sequence_end`` parameters, when it sets any, replace the
        request's fields for these tensors (flags it does not set are then off, as in Triton)."""
        sequence = _response_sequence(response, sequence)
        found = {}
        for model_output, tensor_name in self._outputs[index].items():
            tensor = response.output(model_output)
            if tensor is not None:
                tensor = Tensor(tensor_name, tensor.datatype, tensor.shape, tensor.data)
            found[tensor_name] = Slot(tensor, sequence)
        return found

    def batch_size(self, request: InferenceRequest) -> int:
        """How many inferences ``request`` holds (its batch dimension when the ensemble batches)."""
        if not self.batching or not request.inputs:
            return 1
        return max(1, next(iter(request.inputs.values())).shape[0])


def step_model(step: Any) -> str:
    """The model name a step's requests go to: with --model-namespacing the server sets the step's
    ``model_namespace`` (the repository it resolved the step to) and the model goes by
    '<namespace>::<name>', as Triton writes a model identifier."""
    return f"{step.model_namespace}::{step.model_name}" if step.model_namespace else str(step.model_name)


def _response_sequence(response: InferenceResponse, sequence: SequenceFields) -> SequenceFields:
    """Triton's ``ConsumeResponse``: the sequence fields a step response sets, with its error texts."""
    parameters = response.parameters
    if not any(name in parameters for name in _SEQUENCE_PARAMETERS):
        return sequence
    correlation_id = parameters.get("sequence_id", sequence.id)
    if not isinstance(correlation_id, (int, str)) or isinstance(correlation_id, bool):
        raise ServerError("expected parameter 'sequence_id' to be TRITONSERVER_PARAMETER_INT or "
                          "TRITONSERVER_PARAMETER_STRING", Status.INVALID_ARG)
    flags = []
    for name in ("sequence_start", "sequence_end"):
        value = parameters.get(name, False)
        if not isinstance(value, bool):
            raise ServerError(f"expect parameter '{name}' to be TRITONSERVER_PARAMETER_BOOL", Status.INVALID_ARG)
        flags.append(value)
    return SequenceFields(correlation_id, *flags)


def response_parameters(request: InferenceRequest, sequence: SequenceFields) -> dict[str, int | str | bool]:
    """The parameters Triton puts on an ensemble response holding a tensor made with ``sequence``. The
    correlation id takes the ensemble request's type: an id of the other type reads as 0 or ""."""
    correlation_id: int | str
    if isinstance(request.sequence_id, str):
        correlation_id = sequence.id if isinstance(sequence.id, str) else ""
    else:
        correlation_id = sequence.id if isinstance(sequence.id, int) else 0
    return {"sequence_id": correlation_id, "sequence_start": sequence.start, "sequence_end": sequence.end}
