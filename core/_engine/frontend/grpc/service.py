"""The GRPCInferenceService servicer: each RPC translates protobuf messages and calls the data plane."""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format

from ...seam import DataPlaneAPI, infer_one
from ...errors import ServerError, unexpected
from ..header_forwarding import HeaderForwarder
from ...protos import grpc_service_pb2 as pb
from ...protos.grpc_service_pb2_grpc import GRPCInferenceServiceServicer
from ...trace_settings import update_from_grpc
from ..trace import TRACEPARENT, FrontendTrace
from .codec import decode_request, encode_response, params_from_proto, parse_version
from .status import GRPC_CODE
from .stream import InferStream

log = logging.getLogger(__name__)

DECOUPLED_ERROR = "ModelInfer RPC doesn't support models with decoupled transaction policy"
_Response = TypeVar("_Response")
_Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[_Response]]


def _rpc(handler: _Handler[_Response]) -> _Handler[_Response]:
    """End the call with the mapped status when the handler raises ServerError (INTERNAL for a bug)."""
    @functools.wraps(handler)
    async def call(self: Any, request: Any, context: grpc.aio.ServicerContext) -> _Response:
        log.debug("gRPC request: %s", handler.__name__)  # a verbose line (--log-verbose), as Triton's
        try:
            return await handler(self, request, context)
        except ServerError as error:
            code, message = GRPC_CODE[error.status], error.message
        except Exception as error:
            log.exception("gRPC %s failed", handler.__name__)
            failure = unexpected(error)
            code, message = GRPC_CODE[failure.status], failure.message
        await context.abort(code, message)  # raises: ends the call with this status
    return call


def _start_trace(context: grpc.aio.ServicerContext) -> FrontendTrace:
    """The front-end's trace of a unary call: GRPC_WAITREAD_START and _END now (grpc.aio hands the handler
    a message already read), GRPC_SEND_END once the call ends."""
    parent = next((value for key, value in context.invocation_metadata() or ()
                   if key == TRACEPARENT and isinstance(value, str)), None)
    trace = FrontendTrace(parent, "GRPC_WAITREAD_START")
    trace.stamp("GRPC_WAITREAD_END")
    # types-grpcio declares the callback type a class rather than a Protocol, so no function matches it.
    context.add_done_callback(lambda _call: trace.finish("GRPC_SEND_END"))  # type: ignore[arg-type]
    return trace


def _unload_dependents(params: Any) -> bool:
    """The ``unload_dependents`` parameter of an unload request (a bool_param, as Triton requires)."""
    if "unload_dependents" not in params:
        return False
    param = params["unload_dependents"]
    if param.WhichOneof("parameter_choice") != "bool_param":
        raise ServerError("invalid value type for 'unload_dependents' parameter, expected bool_param.")
    return bool(param.bool_param)


class InferenceServicer(GRPCInferenceServiceServicer):
    """Triton's ``inference.GRPCInferenceService``."""

    def __init__(self, dataplane: DataPlaneAPI, header_forwarder: HeaderForwarder | None = None) -> None:
        self.dataplane = dataplane
        self.header_forwarder = header_forwarder  # --grpc-header-forward-pattern

    def _forwarded_headers(self, context: grpc.aio.ServicerContext) -> dict[str, str]:
        """The call's metadata that --grpc-header-forward-pattern adds to its requests' parameters."""
        if self.header_forwarder is None:
            return {}
        return self.header_forwarder.matching(context.invocation_metadata() or ())

    # ---- health and metadata ----------------------------------------------------------------

    @_rpc
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=await self.dataplane.live())

    @_rpc
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self.dataplane.server_ready())

    @_rpc
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=await self.dataplane.model_ready(request.name, parse_version(request.version)))

    @_rpc
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**await self.dataplane.server_metadata())

    @_rpc
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        found = await self.dataplane.model_metadata(request.name, parse_version(request.version))
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=found["name"], versions=found["versions"], platform=found["platform"],
            inputs=[tensor(**t) for t in found["inputs"]], outputs=[tensor(**t) for t in found["outputs"]])

    @_rpc
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=await self.dataplane.model_config(request.name, parse_version(request.version)))

    # ---- inference --------------------------------------------------------------------------

    @_rpc
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        trace = _start_trace(context) if self.dataplane.trace_armed else None
        infer_request = decode_request(request)
        if self.header_forwarder is not None:
            infer_request.parameters.update(self._forwarded_headers(context))
        infer_request.trace = trace
        try:
            response = await infer_one(self.dataplane, infer_request, DECOUPLED_ERROR)
        except asyncio.CancelledError:  # the client cancelled or went away
            infer_request.cancel()
            raise
        message = pb.ModelInferResponse()
        encode_response(response, infer_request, message)
        if trace is not None:
            trace.stamp("INFER_RESPONSE_COMPLETE")
            trace.stamp("GRPC_SEND_START")
        return message

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ModelStreamInferResponse]:
        stream = InferStream(self.dataplane, context, self._forwarded_headers(context))
        async for response in stream.serve(request_iterator):
            yield response

    # ---- model repository -------------------------------------------------------------------

    @_rpc
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        entry = pb.RepositoryIndexResponse.ModelIndex
        index = await self.dataplane.repository_index(request.ready, request.repository_name)
        return pb.RepositoryIndexResponse(models=[entry(**model) for model in index])

    @_rpc
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: Any) -> pb.RepositoryModelLoadResponse:
        await self.dataplane.load_model(request.model_name, params_from_proto(request.parameters),
                                        request.repository_name)
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: Any) -> pb.RepositoryModelUnloadResponse:
        await self.dataplane.unload_model(request.model_name, _unload_dependents(request.parameters),
                                          request.repository_name)
        return pb.RepositoryModelUnloadResponse()

    # ---- statistics -------------------------------------------------------------------------

    @_rpc
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        stats = await self.dataplane.model_statistics(request.name, parse_version(request.version))
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    # ---- shared memory --------------------------------------------------------------------------

    @_rpc
    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest,
                                       context: Any) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in await self.dataplane.shared_memory_status("system", request.name):
            response.regions[region["name"]].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @_rpc
    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest,
                                         context: Any) -> pb.SystemSharedMemoryRegisterResponse:
        await self.dataplane.register_system_shared_memory(request.name, request.key, request.offset,
                                                           request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @_rpc
    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                           context: Any) -> pb.SystemSharedMemoryUnregisterResponse:
        await self.dataplane.unregister_shared_memory("system", request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_rpc
    async def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest,
                                     context: Any) -> pb.CudaSharedMemoryStatusResponse:
        response = pb.CudaSharedMemoryStatusResponse()
        for region in await self.dataplane.shared_memory_status("cuda", request.name):
            response.regions[region["name"]].CopyFrom(pb.CudaSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @_rpc
    async def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest,
                                       context: Any) -> pb.CudaSharedMemoryRegisterResponse:
        await self.dataplane.register_cuda_shared_memory(request.name, request.raw_handle, request.device_id,
                                                         request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    @_rpc
    async def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest,
                                         context: Any) -> pb.CudaSharedMemoryUnregisterResponse:
        await self.dataplane.unregister_shared_memory("cuda", request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ---- logging -------------------------------------------------------------------------------

    @_rpc
    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        if request.settings:
            changes = {}
            for name, value in request.settings.items():
                choice = value.WhichOneof("parameter_choice")
                changes[name] = None if choice is None else getattr(value, choice)
            settings = await self.dataplane.update_log_settings(changes)
        else:
            settings = await self.dataplane.log_settings()
        response = pb.LogSettingsResponse()
        for name, current in settings.items():
            kind = "bool_param" if isinstance(current, bool) else "uint32_param" if isinstance(current, int) \
                else "string_param"
            setattr(response.settings[name], kind, current)
        return response

    # ---- tracing -------------------------------------------------------------------------------

    @_rpc
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        update = update_from_grpc({name: list(value.value) for name, value in request.settings.items()})
        response = pb.TraceSettingResponse()
        for name, values in (await self.dataplane.trace_setting(request.model_name, update)).items():
            response.settings[name].value.extend(values)
        return response
