"""The GRPCInferenceService servicer: each RPC translates protobuf messages and calls the data plane."""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format

from ..dataplane import DataPlane
from ..errors import ServerError, unsupported
from ..protos import grpc_service_pb2 as pb
from ..protos.grpc_service_pb2_grpc import GRPCInferenceServiceServicer
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
        try:
            return await handler(self, request, context)
        except ServerError as error:
            code, message = GRPC_CODE[error.status], error.message
        except Exception as error:
            log.exception("gRPC %s failed", handler.__name__)
            code, message = grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}"
        await context.abort(code, message)  # raises: ends the call with this status
    return call


def _not_built(rpc: str, extension: str) -> _Handler[Any]:
    """An RPC whose feature triton-serve does not have yet: UNIMPLEMENTED, naming the extension."""
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            f"{rpc} is not supported yet: triton-serve does not implement the "
                            f"'{extension}' extension")
    handler.__name__ = rpc
    return handler


def _check_repository_name(name: str) -> None:
    if name:
        raise unsupported("'repository_name' specification is not supported")


class InferenceServicer(GRPCInferenceServiceServicer):
    """Triton's ``inference.GRPCInferenceService``."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane

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
        infer_request = decode_request(request)
        try:
            response = await self.dataplane.infer(infer_request, DECOUPLED_ERROR)
        except asyncio.CancelledError:  # the client cancelled or went away
            infer_request.cancel()
            raise
        message = pb.ModelInferResponse()
        encode_response(response, infer_request, message)
        return message

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ModelStreamInferResponse]:
        async for response in InferStream(self.dataplane, context).serve(request_iterator):
            yield response

    # ---- model repository -------------------------------------------------------------------

    @_rpc
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        _check_repository_name(request.repository_name)
        entry = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(
            models=[entry(**model) for model in await self.dataplane.repository_index(request.ready)])

    @_rpc
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: Any) -> pb.RepositoryModelLoadResponse:
        _check_repository_name(request.repository_name)
        await self.dataplane.load_model(request.model_name, params_from_proto(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: Any) -> pb.RepositoryModelUnloadResponse:
        _check_repository_name(request.repository_name)
        await self.dataplane.unload_model(request.model_name)
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

    # ---- features not built yet ---------------------------------------------------------------

    TraceSetting = _not_built("TraceSetting", "trace")
    LogSettings = _not_built("LogSettings", "logging")
