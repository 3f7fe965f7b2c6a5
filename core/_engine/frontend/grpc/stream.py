"""ModelStreamInfer: one bidirectional stream carrying many requests, each with 0..N responses."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from ...seam import DataPlaneAPI
from ...errors import ServerError, internal, unavailable, unexpected
from ...inference import InferenceRequest, InferenceResponse
from ...protos.grpc_service_pb2 import ModelInferRequest, ModelStreamInferResponse
from .codec import FINAL_RESPONSE, decode_request, encode_response, parse_version, wants_empty_final_response
from .status import GRPC_CODE

log = logging.getLogger(__name__)

GRPC_ERROR_HEADER = "triton_grpc_error"
SHUTTING_DOWN = "GRPC server is shutting down and has stopped accepting new requests."
# Requests of one stream that may be unanswered at once: past it the stream's next message is not read until one
# is answered, so the transport's flow control holds the client back instead of the server queueing without end.
MAX_IN_FLIGHT = 1024

# What the writer takes from the outbox: a response to write, an error that ends the stream with
# its status (``triton_grpc_error`` mode), or None once every request has been answered.
_Outgoing = ModelStreamInferResponse | ServerError | None


class InferStream:
    """Serves one ModelStreamInfer call.

    Each request runs as its own task, at most ``MAX_IN_FLIGHT`` at once. Responses to non-decoupled models go
    out in request order, as Triton sends them; a decoupled model's responses go out as they come. Errors travel in
    ``error_message`` and the stream stays open, unless the client opened it with the header
    ``triton_grpc_error: true``: then the first error ends the stream with its gRPC status.
    """

    def __init__(self, dataplane: DataPlaneAPI, context: grpc.aio.ServicerContext,
                 forwarded_headers: dict[str, str] | None = None) -> None:
        self.dataplane = dataplane
        self.context = context
        self.forwarded_headers = forwarded_headers  # added to every request's parameters
        self.errors_end_stream = any(key == GRPC_ERROR_HEADER and value.lower() == "true"
                                     for key, value in context.invocation_metadata() or ())
        self._outbox: asyncio.Queue[_Outgoing] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_in_order: asyncio.Future[None] | None = None
        # The native transport's: the bytes a compressed message was inflated to are given back once its request
        # is answered (grpc.aio's context has no such method).
        self._release_message = getattr(context, "release_message", None)

    async def serve(self, requests: AsyncIterator[ModelInferRequest]) -> AsyncIterator[ModelStreamInferResponse]:
        """Yield responses until the client has closed its side and every request is answered."""
        reader = asyncio.create_task(self._read(requests))
        try:
            while (item := await self._outbox.get()) is not None:
                if isinstance(item, ServerError):
                    await self.context.abort(GRPC_CODE[item.status], item.message)
                yield item
        finally:  # finished, aborted, or the client cancelled or disconnected
            reader.cancel()
            for task in list(self._tasks):
                task.cancel()

    async def _read(self, requests: AsyncIterator[ModelInferRequest]) -> None:
        try:
            async for message in requests:
                await self._start(message)
                while len(self._tasks) >= MAX_IN_FLIGHT:
                    await asyncio.wait(list(self._tasks), return_when=asyncio.FIRST_COMPLETED)
            if self._tasks:
                await asyncio.wait(list(self._tasks))
        except Exception as error:  # end the call with a status rather than leave the client waiting
            log.exception("reading a ModelStreamInfer stream failed")
            self._outbox.put_nowait(internal(f"failed to read the request stream: {error}"))
        else:
            self._outbox.put_nowait(None)

    async def _start(self, message: ModelInferRequest) -> None:
        previous = done = None
        if not await self._is_decoupled(message):
            previous = self._last_in_order
            done = self._last_in_order = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._run(message, previous, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _is_decoupled(self, message: ModelInferRequest) -> bool:
        try:
            return await self.dataplane.is_decoupled(message.model_name, parse_version(message.model_version))
        except ServerError:  # reported, in order, by the request's task
            return False

    async def _run(self, message: ModelInferRequest, previous: asyncio.Future[None] | None,
                   done: asyncio.Future[None] | None) -> None:
        """Run one request; ``previous`` resolves once the request before it (in order) has responded."""
        request: InferenceRequest | None = None
        try:
            if not self.dataplane.accepting:
                raise unavailable(SHUTTING_DOWN)
            request = decode_request(message)
            if self.forwarded_headers:
                request.parameters.update(self.forwarded_headers)
            empty_final = wants_empty_final_response(message)
            self.dataplane.submit(request)
            answered = False
            async for response, final in request.responses():
                if answered and done is not None:  # Triton writes one response per non-decoupled request
                    continue
                outgoing = _response_message(request, response, final, empty_final)
                if outgoing is None:
                    continue
                answered = True
                if previous is not None:
                    await previous
                    previous = None
                self._send(outgoing, response.error if response is not None else None)
        except Exception as error:
            failure = error if isinstance(error, ServerError) else unexpected(error)
            if failure is not error:
                log.error("ModelStreamInfer request to model '%s' failed", message.model_name, exc_info=error)
            if previous is not None:
                await previous
            outgoing = ModelStreamInferResponse(error_message=failure.message)
            outgoing.infer_response.id = message.id
            self._send(outgoing, failure)
        except asyncio.CancelledError:
            if request is not None:
                request.cancel()
            raise
        finally:
            if done is not None and not done.done():
                done.set_result(None)
            if self._release_message is not None:
                self._release_message(message)

    def _send(self, message: ModelStreamInferResponse, error: ServerError | None) -> None:
        self._outbox.put_nowait(error if error is not None and self.errors_end_stream else message)


def _response_message(request: InferenceRequest, response: InferenceResponse | None, final: bool,
                      empty_final: bool) -> ModelStreamInferResponse | None:
    """One stream response, marked with ``triton_final_response``; None for a bare final flag that the
    client did not ask to see (``triton_enable_empty_final_response``)."""
    if response is None and not (final and empty_final):
        return None
    message = ModelStreamInferResponse()
    infer = message.infer_response
    if response is not None and response.error is None:
        encode_response(response, request, infer)
    else:
        if response is not None:
            message.error_message = response.error.message  # type: ignore[union-attr]
        infer.model_name = request.model_name
        infer.model_version = str(request.model_version)
        infer.id = request.id
    infer.parameters[FINAL_RESPONSE].bool_param = final
    return message
