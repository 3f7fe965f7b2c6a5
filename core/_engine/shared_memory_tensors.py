"""Request tensors in registered shared memory: inputs read from regions, outputs written into them."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .datatypes import BY_NAME, deserialize_bytes, element_count
from .errors import ServerError, internal
from .inference import InferenceRequest, InferenceResponse, Parameters, Tensor
from .shared_memory import Region, SharedMemoryRegistry
from .shared_memory_parameters import BYTE_SIZE, OFFSET, REGION, no_data


class SharedMemoryLease:
    """The regions one request uses, held from ``DataPlane.submit`` until its final response, so that
    a region cannot be unregistered while a request uses it.

    ``take`` resolves every input that names a region into an array over the region's memory (no
    copy for system shared memory) and checks every output target; ``write_outputs`` copies outputs
    into their regions.
    """

    __slots__ = ("_regions", "_targets", "views")

    def __init__(self) -> None:
        self._regions: list[Region] = []
        self._targets: dict[str, tuple[Region, int, int]] = {}
        self.views = False  # some input array views a region's memory

    @classmethod
    def take(cls, registry: SharedMemoryRegistry, request: InferenceRequest) -> SharedMemoryLease | None:
        """The lease for ``request``, or None when it names no region; ServerError (nothing held) if a
        region is unknown or too small, or an input's size does not match its tensor."""
        lease = None
        try:
            for tensor in request.inputs.values():
                if tensor.parameters and REGION in tensor.parameters:
                    lease = lease or cls()
                    tensor.data = lease._read(registry, request.model_name, tensor)
            for output in request.outputs:
                if REGION in output.parameters:
                    lease = lease or cls()
                    lease._targets[output.name] = lease._use(registry, output.parameters)
        except ServerError:
            if lease is not None:
                lease.release()
            raise
        return lease

    def _use(self, registry: SharedMemoryRegistry, parameters: Parameters) -> tuple[Region, int, int]:
        region = registry.get(parameters[REGION])
        offset, byte_size = parameters.get(OFFSET, 0), parameters.get(BYTE_SIZE, 0)
        region.check_window(offset, byte_size)
        region.acquire()
        self._regions.append(region)
        return region, offset, byte_size

    def _read(self, registry: SharedMemoryRegistry, model: str, tensor: Tensor) -> np.ndarray:
        region, offset, byte_size = self._use(registry, tensor.parameters)
        count = element_count(tensor.shape)
        if tensor.datatype == "BYTES":
            try:
                return deserialize_bytes(region.read(offset, byte_size), count).reshape(tensor.shape)
            except ValueError as error:
                raise ServerError(f"invalid BYTES data for input '{tensor.name}' for model '{model}': "
                                  f"{error}") from None
        dt = BY_NAME[tensor.datatype]
        if byte_size != count * dt.itemsize:
            raise ServerError(f"input byte size mismatch for input '{tensor.name}' for model '{model}'. "
                              f"Expected {count * dt.itemsize}, got {byte_size}")
        self.views = True
        array = np.frombuffer(region.read(offset, byte_size), dt.numpy, count).reshape(tensor.shape)
        array.flags.writeable = False  # the client's memory: a model must not write into it
        return array

    def write_outputs(self, response: InferenceResponse) -> InferenceResponse:
        """``response`` with each output bound for a region written into it and carried without data
        (an error response if one does not fit or its region became unusable)."""
        outputs = []
        try:
            for tensor in response.outputs:
                target = self._targets.get(tensor.name)
                if target is not None:
                    tensor = self._write(tensor, *target)
                outputs.append(tensor)
        except ServerError as error:
            return InferenceResponse.from_error(error)
        return InferenceResponse(outputs, response.parameters)

    @staticmethod
    def _write(tensor: Tensor, region: Region, offset: int, byte_size: int) -> Tensor:
        if tensor.wire is None and tensor.datatype != "BYTES":
            data = np.ascontiguousarray(tensor.data, BY_NAME[tensor.datatype].numpy).data.cast("B")
        else:
            data = memoryview(tensor.wire_bytes())
        if len(data) > byte_size:
            raise internal(f"shared memory size specified with the request for output '{tensor.name}' "
                           f"({byte_size} bytes) should be at least {len(data)} bytes to hold the results")
        region.write(offset, data)
        parameters = {REGION: region.name, OFFSET: offset, BYTE_SIZE: byte_size}
        return Tensor(tensor.name, tensor.datatype, tensor.shape, no_data(tensor.datatype), parameters)

    def release(self) -> None:
        """Let go of every region (once; the request has sent its final response or did not start)."""
        regions, self._regions = self._regions, []
        for region in regions:
            region.release()


def detached(response: InferenceResponse) -> InferenceResponse:
    """``response`` with outputs that own their data, for the response cache: a backend may return
    arrays that view a region's memory, which the client changes and unregisters. Made from its content, so that
    the fields a content subclass adds stay with it (``replace`` on the response would drop what it was received
    with)."""
    content = response.content
    return InferenceResponse.from_content(replace(content, outputs=tuple(
        Tensor(t.name, t.datatype, t.shape, np.array(t.data), t.parameters) for t in content.outputs)))
