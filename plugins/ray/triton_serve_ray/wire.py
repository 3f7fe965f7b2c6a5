"""What crosses between the ingress and a model replica: plain, picklable requests and replies.

``InferenceRequest`` carries its response channel (asyncio objects) and cannot be pickled, so the ingress
sends its content; tensors and errors cross in the core's wire form (``pack_tensors``: one buffer of their
bytes, described by TensorRefs), as at every other process boundary of the server. Errors travel as values
(message and status name): a raised exception would lose its Triton status.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from triton_serve.plugin import (InferenceRequest, InferenceResponse, RequestedOutput, ServerError, Tensor, TensorLayout,
                                 TensorRef, WireError, decode_error, encode_error, tensor_from)

# Tensors in wire form: their TensorRefs with each one's parameters, and the buffer of their bytes.
WireTensors = tuple[list[tuple[TensorRef, dict[str, Any]]], bytes]


def pack(tensors: list[Tensor]) -> WireTensors:
    layout = TensorLayout()
    described = [(layout.add_tensor(tensor), tensor.parameters) for tensor in tensors]
    return described, bytes(layout.tobytes())


def unpack(packed: WireTensors) -> list[Tensor]:
    described, data = packed
    return [tensor_from(data, ref, parameters) for ref, parameters in described]


@dataclass(slots=True)
class WireRequest:
    """An inference request's content, without its response channel."""

    model_name: str
    model_version: int | None
    id: str
    inputs: WireTensors
    outputs: list[RequestedOutput]
    parameters: dict[str, Any]

    @classmethod
    def of(cls, request: InferenceRequest) -> WireRequest:
        return cls(request.model_name, request.model_version, request.id, pack(list(request.inputs.values())),
                   request.outputs, request.parameters)

    def to_request(self) -> InferenceRequest:
        return InferenceRequest(self.model_name, self.model_version, id=self.id,
                                inputs={tensor.name: tensor for tensor in unpack(self.inputs)},
                                outputs=self.outputs, parameters=self.parameters)


@dataclass(slots=True)
class WireResponse:
    """One inference response's outputs and parameters, and the model version that served it."""

    outputs: WireTensors
    parameters: dict[str, Any]
    model_version: int | None  # the data plane sets the request's version as it resolves the model

    @classmethod
    def of(cls, response: InferenceResponse, model_version: int | None) -> WireResponse:
        return cls(pack(response.outputs), response.parameters, model_version)

    def to_response(self) -> InferenceResponse:
        return InferenceResponse(unpack(self.outputs), self.parameters)


@dataclass(slots=True)
class Reply:
    """A replica's answer to one call: its value, or the ServerError it raised."""

    value: Any = None
    error: WireError | None = None

    @classmethod
    def failed(cls, error: ServerError) -> Reply:
        return cls(error=encode_error(error))

    def unwrap(self) -> Any:
        """The value; raises the replica's ServerError, with its status, if the call failed."""
        if self.error is not None:
            raise decode_error(self.error)
        return self.value
