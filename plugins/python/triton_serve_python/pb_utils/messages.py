"""pb_utils.InferenceRequest and InferenceResponse: what ``execute`` receives and returns."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from . import bls
from .errors import TritonError, TritonModelException, unsupported
from .parameters import checked_parameters
from .response_sender import InferenceResponseSender
from .tensor import Tensor

TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2


class PreferredMemory:
    """Where a BLS request would like its outputs (kept for API compatibility; outputs are CPU memory)."""

    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """A request's trace, as ``request.trace()`` gives it. A BLS request made with ``trace=request.trace()``
    is traced as a child of ``request`` when the server traces that one (Triton's rule); without it, it is
    not traced. ``get_context`` returns None: spans are built once the request is done."""

    def __init__(self, request_key: int = 0) -> None:
        self._request_key = request_key  # the server's key of the request it belongs to; 0: none

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        return None


class InferenceResponse:
    """One response: output tensors and parameters (bool/int/str values), or an error."""

    __slots__ = ("_tensors", "_error", "_parameters")

    def __init__(self, output_tensors: Sequence[Tensor] | None = None, error: TritonError | str | None = None,
                 parameters: dict[str, Any] | str | None = None) -> None:
        tensors = list(output_tensors or [])
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException("InferenceResponse output_tensors must be pb_utils.Tensor objects, "
                                           f"got {type(tensor).__name__}")
        if error is not None:  # (the usual None skips both checks)
            if isinstance(error, str):  # Triton takes the text as the message of an INTERNAL error
                error = TritonError(error)
            elif not isinstance(error, TritonError):
                raise TritonModelException(f"InferenceResponse error must be a pb_utils.TritonError or a str, "
                                           f"got {type(error).__name__}")
        self._tensors = tensors
        self._error = error
        self._parameters = {} if parameters is None else checked_parameters(parameters, "response")

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response parameters as a JSON object string."""
        return json.dumps(self._parameters)


class InferenceRequest:
    """A request: as ``execute`` receives it (with a response sender), or built by a model to run another
    model of the server (business logic scripting: ``exec``, ``async_exec``)."""

    def __init__(self, *, model_name: str, requested_output_names: Sequence[str], inputs: Sequence[Tensor],
                 request_id: str = "", correlation_id: int | str = 0, model_version: int = -1, flags: int = 0,
                 timeout: int = 0, preferred_memory: PreferredMemory | None = None,
                 trace: InferenceTrace | None = None, parameters: dict[str, Any] | str | None = None) -> None:
        for tensor in inputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(f"InferenceRequest inputs must be pb_utils.Tensor objects, "
                                           f"got {type(tensor).__name__}")
        self._fill(model_name, model_version, list(inputs), list(requested_output_names), request_id, correlation_id,
                   flags, timeout, preferred_memory or PreferredMemory(), trace or InferenceTrace(),
                   checked_parameters(parameters, "request", (bool, int, float, str)), None)

    @classmethod
    def _received(cls, model_name: str, model_version: int, inputs: list[Tensor], requested_output_names: list[str],
                  request_id: str, correlation_id: int | str, flags: int, timeout: int, trace: InferenceTrace,
                  parameters: dict[str, Any], sender: InferenceResponseSender) -> InferenceRequest:
        """A request as ``execute`` receives it, without ``__init__``'s checks and copies: the worker made its inputs
        and lists, and the server checked the rest (the parameters' values are checked as ``__init__`` does)."""
        request = cls.__new__(cls)
        request._fill(model_name, model_version, inputs, requested_output_names, request_id, correlation_id, flags,
                      timeout, PreferredMemory(), trace,
                      checked_parameters(parameters, "request", (bool, int, float, str)) if parameters else {}, sender)
        return request

    def _fill(self, model_name: str, model_version: int, inputs: list[Tensor], requested_output_names: list[str],
              request_id: str, correlation_id: int | str, flags: int, timeout: int, preferred_memory: PreferredMemory,
              trace: InferenceTrace, parameters: dict[str, Any], sender: InferenceResponseSender | None) -> None:
        self._model_name = model_name
        self._requested_output_names = requested_output_names
        self._inputs = inputs
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory
        self._trace = trace
        self._parameters = parameters
        self._sender = sender  # set on the requests ``execute`` receives

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence id (0 outside sequences)."""
        return self._correlation_id

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def flags(self) -> int:
        """TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END bits."""
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        """The request's timeout in microseconds (0: none)."""
        return self._timeout

    def parameters(self) -> str:
        """The request parameters as a JSON object string."""
        return json.dumps(self._parameters)

    def trace(self) -> InferenceTrace:
        return self._trace

    def requested_output_names(self) -> list[str]:
        return list(self._requested_output_names)

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request (asks the server; False for a request the model built)."""
        return self._sender is not None and self._sender.is_cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        """The sender that answers this request from any thread, during or after ``execute``."""
        if self._sender is None:
            raise TritonModelException("Unable to send response. Response sender has no reference to the "
                                       "decoupled state of the model.")
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        raise unsupported("InferenceRequest.set_release_flags (request rescheduling)")

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model and return the response (an iterator of responses with
        ``decoupled=True``); a failure is a response whose ``has_error()`` is True."""
        if decoupled:
            return bls.execute_streaming(self)
        return bls.execute(self)

    def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` as an awaitable, for ``async def execute``."""
        return bls.execute_async(self, decoupled)
