"""The public API for plugins that serve more paths on the HTTP port (``tserve_register_http_apps``).

Their apps run in every front-end process, and a front-end process holds no model: it reaches models only
through the data-plane seam (``DataPlaneAPI``). Import from here, not from ``triton_serve.plugin``, which
loads the model owner's modules (repository, schedulers, backends) into each front-end process.
"""
from __future__ import annotations

from ._engine.datatypes import TensorType, datatype_of_config, deserialize_bytes, serialize_bytes
from ._engine.errors import ServerError, Status
from ._engine.hookspecs import hookimpl
from ._engine.frontend.http_apps import AsgiApp, HttpAppRegistry
from ._engine.inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from ._engine.frontend.openai_listener import OpenAIOptions
from ._engine.protos.model_config_pb2 import DataType, ModelConfig, ModelInput, ModelOutput
from ._engine.seam import DataPlaneAPI, infer_one

__all__ = [
    # the hook and its registry
    "hookimpl", "HttpAppRegistry", "AsgiApp",
    # the data-plane seam: submit requests, read configs and the repository index
    "DataPlaneAPI", "infer_one",
    # the --openai-* flags, given to an app registered with openai_options=True
    "OpenAIOptions",
    # requests, responses, tensors
    "InferenceRequest", "InferenceResponse", "RequestedOutput", "Tensor", "TensorType", "datatype_of_config",
    "serialize_bytes", "deserialize_bytes",
    # model configuration (Triton's model_config.proto messages)
    "ModelConfig", "ModelInput", "ModelOutput", "DataType",
    # errors
    "ServerError", "Status",
]
