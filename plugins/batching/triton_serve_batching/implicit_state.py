"""Implicit state (``sequence_batching.state``): each sequence's state tensors, carried from one
request's outputs to the next request's inputs."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from triton_serve.plugin import (InferenceRequest, InferenceResponse, ModelInstance, ModelSequenceBatching,
                                 ModelSpec, RequestedOutput, ServerError, Tensor, TensorType, datatype_of_config,
                                 from_wire_bytes)

from .slots import ActiveSequence


class ImplicitStates:
    """The config's implicit states (``sequence_batching.state``): each one's initial value, and the
    state tensors each request of a sequence gets."""

    def __init__(self, model: ModelSpec) -> None:
        config = model.config
        self._specs: list[tuple[ModelSequenceBatching.State, TensorType, np.ndarray]] = []
        seen: set[str] = set()
        for state in config.sequence_batching.state:
            if state.input_name in seen:
                raise ServerError(f"State input name '{state.input_name}' specified more than once.")
            seen.add(state.input_name)
            datatype = datatype_of_config(state.data_type)
            self._specs.append((state, datatype, _initial_state(model, state, datatype)))
        self.output_names = [state.output_name for state, _, _ in self._specs]
        self._declared_outputs = {output.name for output in config.output}

    def __bool__(self) -> bool:
        return bool(self._specs)

    def inputs(self, carried: dict[str, np.ndarray] | None) -> list[Tensor]:
        """The state input tensors: the previous request's state outputs, else the initial values."""
        tensors = []
        for state, datatype, initial in self._specs:
            data = initial if carried is None else carried.get(state.input_name, initial)
            tensors.append(Tensor(state.input_name, datatype.name, tuple(data.shape), data))
        return tensors

    def take(self, response: InferenceResponse, carried: dict[str, np.ndarray] | None,
             requested: set[str]) -> dict[str, np.ndarray]:
        """The state to carry after ``response``; removes state outputs the client may not see
        (undeclared in the config's outputs, or not among the outputs it asked for)."""
        kept = dict(carried or {})
        for state, datatype, _ in self._specs:
            tensor = response.output(state.output_name)
            if tensor is None:
                continue  # a model that does not update a state keeps the previous one
            data = np.asarray(tensor.data)
            kept[state.input_name] = data if datatype.name == "BYTES" else data.astype(datatype.numpy, copy=False)
            if state.output_name not in self._declared_outputs or (requested and state.output_name not in requested):
                response.outputs.remove(tensor)
        return kept


def _initial_state(model: ModelSpec, state: ModelSequenceBatching.State, datatype: TensorType) -> np.ndarray:
    """A state's value for the first request of a sequence (zeros unless ``initial_state`` says otherwise)."""
    batch = [1] if model.config.max_batch_size > 0 else []
    if not state.initial_state:
        return _zeros(tuple(batch + [1 if d == -1 else d for d in state.dims]), datatype)
    if len(state.initial_state) > 1:
        raise ServerError(f"initial_state field for state input '{state.input_name}' must contain exactly one or "
                          f"zero element. Found '{len(state.initial_state)}' elements.")
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        raise ServerError(f"The data type used for 'initial_state' field of state '{state.input_name}' does not "
                          "match the state data type.")
    if not initial.name:
        raise ServerError(f"Field 'name' must be set when using initial_state for state input '{state.input_name}'.")
    if len(initial.dims) != len(state.dims):
        raise ServerError(f"Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions "
                          f"for state input '{state.input_name}'. {len(initial.dims)} != {len(state.dims)}")
    for initial_dim, state_dim in zip(initial.dims, state.dims):
        if initial_dim == -1:
            raise ServerError(f"'initial_state' field for state input name '{state.input_name}' contains variable "
                              "dimensions.")
        if state_dim != -1 and initial_dim != state_dim:
            raise ServerError(f"'initial_state' dim for input name '{state.input_name}' doesn't match 'state' dim "
                              f"description. {initial_dim} != {state_dim}")
    shape = tuple(batch + list(initial.dims))
    if initial.WhichOneof("state_data") != "data_file":
        return _zeros(shape, datatype)
    path = model.model_dir / "initial_state" / initial.data_file
    try:
        content = path.read_bytes()
    except OSError as error:
        raise ServerError(f"failed to read initial_state data file '{path}' for state input "
                          f"'{state.input_name}': {error.strerror}") from None
    count = int(np.prod(shape))
    if datatype.name != "BYTES":
        expected = count * datatype.itemsize
        if len(content) < expected:
            raise ServerError(f"initial_state setting expects {expected} bytes, but the data provided from "
                              f"{initial.data_file} only has {len(content)} bytes.")
        content = content[:expected]
    try:
        return from_wire_bytes(datatype.name, shape, content).copy()
    except ValueError as error:
        raise ServerError(f"initial_state data file '{initial.data_file}' for state input "
                          f"'{state.input_name}' does not hold {count} elements: {error}") from None


def _zeros(shape: tuple[int, ...], datatype: TensorType) -> np.ndarray:
    if datatype.name == "BYTES":
        return np.full(shape, b"", dtype=np.object_)
    return np.zeros(shape, dtype=datatype.numpy)


class StatefulExecution(ModelInstance):
    """Runs one batch on a model instance and carries implicit state: each sequence's state
    outputs become its next request's state inputs, and are taken out of the responses."""

    def __init__(self, instance: ModelInstance, sequences: dict[int, ActiveSequence], states: ImplicitStates) -> None:
        self._instance = instance
        self._sequences = sequences  # by id() of each request (the pool leaves cancelled ones out)
        self._states = states

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse] | None:
        asked = [list(request.outputs) for request in requests]
        for request in requests:
            if request.outputs:  # a backend returns only what is asked for: ask for the states too
                named = {output.name for output in request.outputs}
                request.outputs.extend(RequestedOutput(name) for name in self._states.output_names if name not in named)
        try:
            responses = await self._instance.execute(requests)
        finally:
            for request, outputs in zip(requests, asked):
                request.outputs = outputs
        if responses is None:
            return None
        for request, response, outputs in zip(requests, responses, asked):
            if response.error is None:
                sequence = self._sequences[id(request)]
                sequence.state = self._states.take(response, sequence.state, {o.name for o in outputs})
        return responses

    def is_ready(self) -> bool:
        return self._instance.is_ready()

    def not_ready_reason(self) -> str:
        return self._instance.not_ready_reason()
