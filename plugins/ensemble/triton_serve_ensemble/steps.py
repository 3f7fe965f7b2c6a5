"""An ensemble's steps, resolved once per loaded version: which tensors each step needs, which steps
follow it, and how its requests and responses map to ensemble tensors."""
from __future__ import annotations

from triton_serve.plugin import InferenceRequest, InferenceResponse, ModelConfig, RequestedOutput, Tensor


class StepGraph:
    """The steps of one ensemble config (already validated by ``check_scheduling``)."""

    def __init__(self, config: ModelConfig) -> None:
        self.steps = list(config.ensemble_scheduling.step)
        self.batching = config.max_batch_size > 0
        # Ensemble inputs a request may leave out: a step whose input maps one of them runs without it.
        self.optional = {tensor.name for tensor in config.input if tensor.optional}
        self._inputs = [dict(step.input_map) for step in self.steps]
        self._outputs = [dict(step.output_map) for step in self.steps]
        consumers: dict[str, set[int]] = {}
        for index, inputs in enumerate(self._inputs):
            for tensor_name in inputs.values():
                consumers.setdefault(tensor_name, set()).add(index)
        self._next = [set().union(*(consumers.get(t, set()) for t in outputs.values()))
                      for outputs in self._outputs]
        self._downstream = [self._reach(index) for index in range(len(self.steps))]

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

    def is_ready(self, index: int, tensors: dict[str, Tensor]) -> bool:
        """Every tensor step ``index`` maps exists (an optional ensemble input may be absent)."""
        return all(t in tensors or t in self.optional for t in self._inputs[index].values())

    def step_request(self, index: int, request: InferenceRequest, tensors: dict[str, Tensor]) -> InferenceRequest:
        """The request for step ``index`` of ensemble request ``request``: its mapped tensors (no copy),
        the outputs the ensemble uses, and the ensemble request's id, parameters, priority and timeout."""
        step = self.steps[index]
        inputs = {}
        for model_input, tensor_name in self._inputs[index].items():
            tensor = tensors.get(tensor_name)
            if tensor is not None:
                inputs[model_input] = Tensor(model_input, tensor.datatype, tensor.shape, tensor.data)
        step_request = InferenceRequest(
            step.model_name, None if step.model_version == -1 else step.model_version, id=request.id,
            inputs=inputs, outputs=[RequestedOutput(name) for name in self._outputs[index]],
            parameters=dict(request.parameters))
        step_request.priority = request.priority
        step_request.timeout_us = request.timeout_us
        step_request.sequence_id = request.sequence_id
        step_request.sequence_start = request.sequence_start
        step_request.sequence_end = request.sequence_end
        return step_request

    def step_outputs(self, index: int, response: InferenceResponse) -> dict[str, Tensor]:
        """The ensemble tensors in one response of step ``index``."""
        found = {}
        for model_output, tensor_name in self._outputs[index].items():
            tensor = response.output(model_output)
            if tensor is not None:
                found[tensor_name] = Tensor(tensor_name, tensor.datatype, tensor.shape, tensor.data)
        return found

    def batch_size(self, request: InferenceRequest) -> int:
        """How many inferences ``request`` holds (its batch dimension when the ensemble batches)."""
        if not self.batching or not request.inputs:
            return 1
        return max(1, next(iter(request.inputs.values())).shape[0])
