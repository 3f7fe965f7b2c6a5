"""Triton's error codes as gRPC status codes (server:src/grpc/grpc_utils.cc)."""
from __future__ import annotations

import grpc

from ...errors import Status

GRPC_CODE = {
    Status.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Status.INTERNAL: grpc.StatusCode.INTERNAL,
    Status.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Status.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Status.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Status.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Status.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Status.CANCELLED: grpc.StatusCode.CANCELLED,
}
