"""The Python-backend model API, imported by models as ``import triton_python_backend_utils as pb_utils``."""
from __future__ import annotations

from triton_serve_python.pb_utils.dtypes import (
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from triton_serve_python.pb_utils.errors import TritonError, TritonModelException
from triton_serve_python.pb_utils.logger import Logger
from triton_serve_python.pb_utils.messages import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_CPU_PINNED,
    TRITONSERVER_MEMORY_GPU,
    InferenceRequest,
    InferenceResponse,
    InferenceTrace,
    PreferredMemory,
)
from triton_serve_python.pb_utils.metrics import Metric, MetricFamily
from triton_serve_python.pb_utils.model_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from triton_serve_python.pb_utils.model_dir import get_model_dir
from triton_serve_python.pb_utils.response_sender import TRITONSERVER_RESPONSE_COMPLETE_FINAL, InferenceResponseSender
from triton_serve_python.pb_utils.tensor import Tensor
from triton_serve_python.pb_utils.unsupported import is_model_ready, load_model, unload_model

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input called ``name``, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output called ``name``, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


__all__ = [
    "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "InferenceTrace", "Logger", "Metric",
    "MetricFamily", "ModelConfig", "PreferredMemory", "Tensor", "TritonError", "TritonModelException",
    "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_CPU_PINNED", "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "deserialize_bytes_tensor", "get_input_config_by_name", "get_input_tensor_by_name", "get_model_dir",
    "get_output_config_by_name", "get_output_tensor_by_name", "is_model_ready", "load_model", "numpy_to_triton_type",
    "serialize_byte_tensor", "triton_string_to_numpy", "triton_to_numpy_type", "unload_model",
    "using_decoupled_model_transaction_policy",
]
