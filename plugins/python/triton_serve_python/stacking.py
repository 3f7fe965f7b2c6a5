"""The ``stack_requests`` extension: a batch reaches ``model.py`` as one request with stacked inputs."""
from __future__ import annotations

from collections.abc import Sequence

from triton_serve.plugin import (InferenceRequest, InferenceResponse, ModelConfig, ModelSpec, RequestedOutput,
                                 ServerError, Status, Tensor, concat_inputs, split_outputs)

STACK_REQUESTS = "stack_requests"  # the model parameter that turns stacking on


def stacks_requests(model: ModelSpec) -> bool:
    """Whether the model's ``stack_requests`` parameter is on; a ServerError if it cannot apply."""
    if not model.parameters.stack_requests:
        return False
    config = model.config
    where = f"parameters of python model '{model.name}'"
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


def unstack_response(response: InferenceResponse | None, requests: Sequence[InferenceRequest],
                     config: ModelConfig) -> list[InferenceResponse]:
    """Each request's rows of the stacked response, with its parameters; an error fails the whole batch, and
    so does None (model.py answered through the response sender, which cannot split a response by request)."""
    if response is None:
        raise ServerError(f"python model '{config.name}': with '{STACK_REQUESTS}' on, execute must return the "
                          "stacked request's response; its response sender cannot answer the requests it holds",
                          Status.INTERNAL)
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
