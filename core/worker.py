"""The public API for code that runs in a model's worker process (the Python backend's worker, PyTriton's
isolated functions): request and response content and its codec, tensors in the one binary form every process
boundary uses, Triton's datatypes, the model configuration message, errors, and the window a busy poller learns.
Unlike ``triton_serve.plugin`` it loads none of the server (no grpc, starlette, uvicorn, prometheus_client or
pluggy: ``tests/test_frontend_imports.py``), so a worker starts sooner and smaller. The server's side of the
same boundary imports these names from ``triton_serve.plugin``.
"""
from __future__ import annotations

from ._engine.datatypes import datatype_of, deserialize_bytes, serialize_bytes
from ._engine.errors import ServerError, Status
from ._engine.protos.model_config_pb2 import ModelConfig
from ._engine.inference import RequestContent, RequestedOutput, ResponseContent, Tensor
from ._engine.poll_window import PollWindow
from ._engine.wire import (ContentMeta, TensorLayout, TensorRef, content_type_named, decode_content, encode_content,
                           pack_content, pack_tensors, read_tensor)

__all__ = [
    # request and response content: the one form of a request or response that crosses a process boundary, and
    # its codec (metadata of plain values, tensors' bytes in one buffer); the content types a server names
    "RequestContent", "ResponseContent", "RequestedOutput", "Tensor", "ContentMeta", "encode_content",
    "decode_content", "pack_content", "content_type_named",
    # tensors across a process boundary (one binary form: a buffer of raw bytes, each tensor a TensorRef into it)
    "TensorRef", "TensorLayout", "pack_tensors", "read_tensor",
    # datatypes: a numpy array's Triton datatype, BYTES elements to and from their length-prefixed form
    "datatype_of", "serialize_bytes", "deserialize_bytes",
    # Triton's model configuration message (model_config.proto)
    "ModelConfig",
    # errors, with their Triton status
    "ServerError", "Status",
    # how long to busy-poll for the next batch or answer, learnt from the waits (the server's pollers use it too)
    "PollWindow",
]
