"""Batch helpers for framework backends: one concatenated array per input, and outputs split
back into one response per request.

A framework backend's ``execute`` typically reads::

    arrays = concat_inputs(requests, self.model.config)
    results = await asyncio.to_thread(self.session.run, arrays)     # name -> ndarray
    return split_outputs(results, requests, self.model.config)

Both helpers mark the compute phases for the statistics extension.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .datatypes import TensorType, datatype_of_config
from .errors import ServerError, internal
from .inference import InferenceRequest, InferenceResponse, Tensor
from .protos.model_config_pb2 import ModelConfig
from .statistics import mark_inputs_ready, mark_outputs_ready


def request_batch_size(request: InferenceRequest, config: ModelConfig) -> int:
    """How many inferences a request holds: its batch dimension, or 1 for a non-batching model."""
    if config.max_batch_size <= 0 or not request.inputs:
        return 1
    return next(iter(request.inputs.values())).shape[0]


def concat_inputs(requests: Sequence[InferenceRequest], config: ModelConfig) -> dict[str, np.ndarray]:
    """The batch's inputs by name: each request's array concatenated along the batch dimension.

    Inputs with ``allow_ragged_batch`` are flattened and concatenated into one 1-D array. An
    optional input must be given by every request of the batch or by none.
    """
    first = requests[0]
    ragged = {spec.name for spec in config.input if spec.allow_ragged_batch}
    arrays = {}
    for name in first.inputs:
        parts = []
        for request in requests:
            tensor = request.inputs.get(name)
            if tensor is None:
                raise ServerError(f"input '{name}' of model '{first.model_name}' is given by some requests "
                                  "of a batch and not by others")
            parts.append(tensor.data.reshape(-1) if name in ragged else tensor.data)
        arrays[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    mark_inputs_ready()
    return arrays


def split_outputs(outputs: Mapping[str, np.ndarray], requests: Sequence[InferenceRequest],
                  config: ModelConfig) -> list[InferenceResponse]:
    """One response per request, each holding its rows of every output it asked for (all
    outputs when it named none). Outputs are converted to the config's datatypes."""
    mark_outputs_ready()
    declared = {spec.name: datatype_of_config(spec.data_type) for spec in config.output}
    for state in config.sequence_batching.state:  # implicit state: the sequence batcher takes it out
        declared.setdefault(state.output_name, datatype_of_config(state.data_type))
    converted = {name: _as_datatype(array, declared.get(name), name, requests[0].model_name)
                 for name, array in outputs.items()}
    sizes = [request_batch_size(request, config) for request in requests]
    total = sum(sizes)
    if config.max_batch_size > 0:
        for name, array in converted.items():
            if array.ndim == 0 or array.shape[0] != total:
                raise internal(f"model '{requests[0].model_name}' returned output '{name}' with shape "
                               f"{list(array.shape)} for a batch of {total}; its first dimension must be the batch")
    elif len(requests) != 1:
        raise internal(f"model '{requests[0].model_name}' does not batch but was given {len(requests)} requests")
    responses = []
    start = 0
    for request, size in zip(requests, sizes):
        wanted = {output.name for output in request.outputs}
        tensors = []
        for name, array in converted.items():
            if wanted and name not in wanted:
                continue
            rows = array[start:start + size] if config.max_batch_size > 0 else array
            tensors.append(Tensor(name, declared[name].name, tuple(rows.shape), rows))
        responses.append(InferenceResponse(tensors))
        start += size
    return responses


def _as_datatype(array: np.ndarray, datatype: TensorType | None, name: str, model: str) -> np.ndarray:
    array = np.asarray(array)
    if datatype is None:
        raise internal(f"model '{model}' returned output '{name}', which its config does not declare")
    if datatype.name == "BYTES":
        if array.dtype.kind in ("U", "S", "O"):
            flat = [value.encode() if isinstance(value, str) else bytes(value) for value in array.reshape(-1)]
            result = np.empty(len(flat), dtype=np.object_)
            result[:] = flat
            return result.reshape(array.shape)
        raise internal(f"model '{model}' returned output '{name}' as {array.dtype}, but its config declares BYTES")
    if datatype.name == "BF16":
        return array.view(np.uint16) if array.dtype.itemsize == 2 else array
    if array.dtype != datatype.numpy:
        raise internal(f"model '{model}' returned output '{name}' as {array.dtype}, but its config "
                       f"declares {datatype.name}")
    return array
