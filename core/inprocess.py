"""The in-process API: start a triton-serve server from Python and call its models without a socket,
through the same inference path as HTTP and gRPC clients (see docs/python-native.md).

    from triton_serve.inprocess import Server

    with Server("models/") as server:
        outputs = server.model("add_sub").infer({"INPUT0": a, "INPUT1": b})
"""
from __future__ import annotations

from ._engine.embedded import Model, Server
from ._engine.errors import ServerError, Status
from ._engine.protos.model_config_pb2 import ModelConfig
from ._engine.server import ServerOptions

__all__ = ["Model", "ModelConfig", "Server", "ServerError", "ServerOptions", "Status"]
