"""The ``stack_requests`` extension: a batch reaches ``model.py`` as one request with stacked inputs."""
from __future__ import annotations

from collections.abc import Sequence

from triton_serve.plugin import (InferenceRequest, InferenceResponse, ModelConfig, RequestedOutput, ServerError, Tensor,
                                 concat_inputs, split_outputs)

from .options import parse_flag

STACK_REQUESTS = "stack_requests"  # the model parameter that turns stacking on


def stacks_requests(config: ModelConfig) -> bool:
    """Whether the model's ``stack_requests`` parameter is on; a ServerError if it is invalid or cannot apply."""
    if STACK_REQUESTS not in config.parameters:
        return False
    where = f"parameters of python model '{config.name}'"
    if not parse_flag(config.parameters[STACK_REQUESTS].string_value, STACK_REQUESTS, where):
        return False
    if config.max_batch_size <= 0:
        raise ServerError(f"{where}: '{STACK_REQUESTS}' needs max_batch_size > 0, since requests are stacked "
                          "along the batch dimension; the model has max_batch_size "
                          f"{config.max_batch_size}")
    if config.HasField("sequence_batching"):
        raise ServerError(f"{where}: '{STACK_REQUESTS}' cannot be used with sequence_batching, since a stacked "
                          "request carries one correlation id for the requests of several sequences")
    if config.model_transaction_policy.decoupled:
        raise ServerError(f"{where}: '{STACK_REQUESTS}' cannot be used with a decoupled model, since a stacked "
                          "request has no response sender for each request it holds")
    return True


def stack_requests(requests: Sequence[InferenceRequest], config: ModelConfig) -> InferenceRequest:
    """One request whose inputs are the batch's inputs concatenated along the batch dimension.

    It asks for the union of the requested outputs (all outputs if any request named none), and
    carries the first request's id, parameters, timeout and sequence fields.
    """
    first = requests[0]
    inputs = {name: Tensor(name, first.inputs[name].datatype, tuple(array.shape), array)
              for name, array in concat_inputs(requests, config).items()}
    stacked = InferenceRequest(first.model_name, first.model_version, id=first.id, inputs=inputs,
                               outputs=_union_of_outputs(requests), parameters=first.parameters)
    stacked.timeout_us = first.timeout_us
    stacked.sequence_id, stacked.sequence_start, stacked.sequence_end = \
        first.sequence_id, first.sequence_start, first.sequence_end
    return stacked


def unstack_response(response: InferenceResponse, requests: Sequence[InferenceRequest],
                     config: ModelConfig) -> list[InferenceResponse]:
    """Each request's rows of the stacked response, with its parameters; an error fails the whole batch."""
    if response.error is not None:
        raise response.error
    responses = split_outputs({tensor.name: tensor.data for tensor in response.outputs}, requests, config)
    for split in responses:
        split.parameters = dict(response.parameters)
    return responses


def _union_of_outputs(requests: Sequence[InferenceRequest]) -> list[RequestedOutput]:
    if any(not request.outputs for request in requests):
        return []
    names = dict.fromkeys(output.name for request in requests for output in request.outputs)
    return [RequestedOutput(name) for name in names]
