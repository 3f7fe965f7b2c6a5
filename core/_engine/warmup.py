"""Model warmup: runs the config's ``model_warmup`` samples on every instance before it serves.

As in Triton, each sample becomes ``batch_size`` requests of batch 1 executed together as one batch,
``count`` times (at least once); a sample with ``batch_size: 0`` is skipped; data is zeros, random
bytes (zeros for BYTES), or a file under the model's ``warmup/`` folder. The samples run straight
on the instance, not through the scheduler, so they are not counted in the model's statistics.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .backend import ModelInstance, ModelSpec
from .datatypes import BY_CONFIG_NAME, deserialize_bytes, element_count
from .errors import ServerError
from .inference import InferenceRequest, InferenceResponse, Tensor
from .protos.model_config_pb2 import DataType as ConfigDataType
from .protos.model_config_pb2 import ModelWarmup

log = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"


@dataclass
class WarmupSample:
    """One ``model_warmup`` entry, its input tensors built once and shared by its requests."""

    name: str
    batch_size: int
    count: int
    inputs: list[Tensor]

    def requests(self, model_name: str, version: int) -> list[InferenceRequest]:
        return [InferenceRequest(model_name, version, id=f"warmup:{self.name}",
                                 inputs={tensor.name: tensor for tensor in self.inputs})
                for _ in range(self.batch_size)]


def warmup_samples(spec: ModelSpec) -> list[WarmupSample]:
    """Build the samples of ``spec``'s config; raises ServerError with Triton's message for a bad one."""
    config = spec.config
    config_inputs = {i.name for i in config.input}
    samples = []
    for setting in config.model_warmup:
        if setting.batch_size == 0:
            log.debug("skipping batch 0 warmup sample '%s' of model '%s'", setting.name, spec.name)
            continue
        inputs = []
        for name, meta in sorted(setting.inputs.items()):
            batched = config.max_batch_size != 0 and name in config_inputs
            inputs.append(_tensor(spec, name, meta, batched))
        samples.append(WarmupSample(setting.name, setting.batch_size, max(setting.count, 1), inputs))
    return samples


def _tensor(spec: ModelSpec, name: str, meta: ModelWarmup.Input, batched: bool) -> Tensor:
    dims = tuple(meta.dims)
    if any(dim < 0 for dim in dims):
        raise ServerError("warmup setting expects all variable-size dimensions are specified "
                          f"for input '{name}'")
    datatype = BY_CONFIG_NAME[ConfigDataType.Name(meta.data_type)]
    shape = ((1,) if batched else ()) + dims
    count = element_count(dims)
    source = meta.WhichOneof("input_data_type")
    if source is None:
        raise ServerError(f"warmup setting expects input '{name}' to have input_data_type set")
    if datatype.name == "BYTES":
        if source == "input_data_file":
            data = deserialize_bytes(_read_file(spec, meta.input_data_file), count)
        else:  # zeros, and random data falls back to zeros: empty strings
            data = np.full(count, b"", dtype=np.object_)
    elif source == "input_data_file":
        size = count * datatype.itemsize
        raw = _read_file(spec, meta.input_data_file)
        if size > len(raw):
            raise ServerError(f"warmup setting expects {size} bytes, but the data provided from "
                              f"{meta.input_data_file} only has {len(raw)} bytes")
        data = np.frombuffer(raw[:size], dtype=datatype.numpy)
    elif source == "random_data":
        data = np.frombuffer(np.random.bytes(count * datatype.itemsize), dtype=datatype.numpy)
        if datatype.name == "BOOL":
            data = data.view(np.uint8) % 2 == 1
    else:
        data = np.zeros(count, dtype=datatype.numpy)
    return Tensor(name, datatype.name, shape, data.reshape(shape))


def _read_file(spec: ModelSpec, file_name: str) -> bytes:
    path = spec.model_dir / WARMUP_FOLDER / file_name
    try:
        return path.read_bytes()
    except OSError as error:
        raise ServerError(f"failed to read warmup data file '{path}': {error.strerror}") from None


async def warm_up(spec: ModelSpec, instance: ModelInstance, samples: Sequence[WarmupSample]) -> None:
    """Run every sample on ``instance``; the first sample whose responses hold an error fails it."""
    for sample in samples:
        for iteration in range(1, sample.count + 1):
            log.debug("model '%s' is running warmup sample '%s' for iteration %d",
                      spec.name, sample.name, iteration)
            errors = await _run(instance, sample.requests(spec.name, spec.version))
            if errors:
                raise ServerError(f"failed to run warmup sample '{sample.name}': "
                                  + "".join(f"{error}; " for error in errors))


async def _run(instance: ModelInstance, requests: list[InferenceRequest]) -> list[str]:
    try:
        returned = await instance.execute(requests)
    except ServerError as error:
        return [error.message]
    except Exception as error:
        return [f"{type(error).__name__}: {error}"]
    errors = []
    if returned is not None:
        errors += _errors(returned)
    else:  # the instance answered through request.send
        for request in requests:
            async for response, _final in request.responses():
                errors += _errors([response] if response is not None else [])
    return errors


def _errors(responses: Sequence[InferenceResponse]) -> list[str]:
    return [response.error.message for response in responses if response.error is not None]
