"""What crosses between the ingress and a model replica: plain, picklable requests and replies.

``InferenceRequest`` carries its response channel (asyncio objects) and cannot be pickled, so the
ingress sends its fields; tensors keep their numpy arrays, which Ray transfers without re-encoding.
Errors travel as values (message and status name): a raised exception would lose its Triton status.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from triton_serve.plugin import (InferenceRequest, InferenceResponse, RequestedOutput, ServerError, Status,
                                 Tensor)


@dataclass(slots=True)
class WireRequest:
    """An inference request's content, without its response channel."""

    model_name: str
    model_version: int | None
    id: str
    inputs: list[Tensor]
    outputs: list[RequestedOutput]
    parameters: dict[str, Any]

    @classmethod
    def of(cls, request: InferenceRequest) -> WireRequest:
        return cls(request.model_name, request.model_version, request.id, list(request.inputs.values()),
                   request.outputs, request.parameters)

    def to_request(self) -> InferenceRequest:
        return InferenceRequest(self.model_name, self.model_version, id=self.id,
                                inputs={tensor.name: tensor for tensor in self.inputs},
                                outputs=self.outputs, parameters=self.parameters)


@dataclass(slots=True)
class WireResponse:
    """One inference response's outputs and parameters, and the model version that served it."""

    outputs: list[Tensor]
    parameters: dict[str, Any]
    model_version: int | None  # the data plane sets the request's version as it resolves the model

    def to_response(self) -> InferenceResponse:
        return InferenceResponse(self.outputs, self.parameters)


@dataclass(slots=True)
class Reply:
    """A replica's answer to one call: its value, or the ServerError it raised (message, status name)."""

    value: Any = None
    error: tuple[str, str] | None = None

    @classmethod
    def failed(cls, error: ServerError) -> Reply:
        return cls(error=(error.message, error.status.name))

    def unwrap(self) -> Any:
        """The value; raises the replica's ServerError, with its status, if the call failed."""
        if self.error is not None:
            message, status = self.error
            raise ServerError(message, Status[status])
        return self.value
