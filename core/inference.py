"""Protocol-neutral inference requests, responses and tensors shared by front-ends, schedulers and backends."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ServerError, Status

Parameters = dict[str, Any]


@dataclass(slots=True)
class Tensor:
    """A named tensor. ``data`` is a numpy array; BYTES tensors hold an object array of ``bytes``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output parameters (binary_data, classification...)."""

    name: str
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferenceResponse:
    """One response: output tensors and response parameters, or an error."""

    outputs: list[Tensor] = field(default_factory=list)
    parameters: Parameters = field(default_factory=dict)
    error: ServerError | None = None

    @classmethod
    def from_error(cls, error: ServerError) -> InferenceResponse:
        return cls(error=error)

    def output(self, name: str) -> Tensor | None:
        for tensor in self.outputs:
            if tensor.name == name:
                return tensor
        return None


class InferenceRequest:
    """A request to one model, and the channel its 0..N responses travel back on.

    Front-ends build requests; the data plane validates them and hands them to the model's
    scheduler; a backend answers through ``send`` (or by returning responses from
    ``ModelInstance.execute``). ``send`` must be called on the server's event loop.
    """

    __slots__ = (
        "model_name", "model_version", "id", "inputs", "outputs", "parameters", "priority",
        "timeout_us", "sequence_id", "sequence_start", "sequence_end", "cancelled", "arrival_ns",
        "enqueued_ns", "response_gate", "_queue", "_finished",
    )

    def __init__(
        self,
        model_name: str,
        model_version: int | None = None,
        *,
        id: str = "",
        inputs: dict[str, Tensor] | None = None,
        outputs: list[RequestedOutput] | None = None,
        parameters: Parameters | None = None,
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.inputs: dict[str, Tensor] = inputs if inputs is not None else {}
        self.outputs: list[RequestedOutput] = outputs if outputs is not None else []
        self.parameters: Parameters = parameters if parameters is not None else {}
        self.priority = 0
        self.timeout_us = 0
        self.sequence_id: int | str = 0
        self.sequence_start = False
        self.sequence_end = False
        self.cancelled = asyncio.Event()
        self.arrival_ns = time.monotonic_ns()  # when the front-end received it
        self.enqueued_ns = self.arrival_ns  # when the data plane handed it to the scheduler
        # A scheduler may set a future here: responses reach the client only once it is done
        # (the dynamic batcher's preserve_ordering).
        self.response_gate: asyncio.Future[None] | None = None
        self._queue: asyncio.Queue[tuple[InferenceResponse | None, bool]] = asyncio.Queue()
        self._finished = False

    @property
    def finished(self) -> bool:
        """True once the final response (or final flag) has been sent."""
        return self._finished

    def send(self, response: InferenceResponse | None, *, final: bool = True) -> None:
        """Send one response; ``final`` closes the stream. ``None`` sends only the final flag."""
        if self._finished:
            raise RuntimeError(f"request {self.id!r} to '{self.model_name}' already sent its final response")
        self._finished = final
        self._queue.put_nowait((response, final))

    def fail(self, error: ServerError) -> None:
        """Answer with an error as the final response, unless already finished."""
        if not self._finished:
            self.send(InferenceResponse.from_error(error))

    async def responses(self) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        """Yield ``(response, final)`` pairs until the final one (after ``response_gate``, if set)."""
        while True:
            if self.response_gate is not None:
                await self.response_gate
            response, final = await self._queue.get()
            yield response, final
            if final:
                return

    async def single_response(self) -> InferenceResponse:
        """Wait for the one response of a non-decoupled request."""
        async for response, _final in self.responses():
            if response is not None:
                return response
        raise ServerError(f"model '{self.model_name}' sent no response", Status.INTERNAL)
