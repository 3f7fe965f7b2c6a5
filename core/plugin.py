"""The public API for plugin authors: everything a backend, scheduler, cache or repository-source plugin
needs, and the way to embed the server in another host. Import only from here (tests: also
``triton_serve.testing``); the rest of the package is private and changes without notice.
"""
from __future__ import annotations

from ._engine.backend import Backend, InstanceSpec, Model, ModelInstance, ModelSpec
from ._engine.batch import concat_inputs, request_batch_size, split_outputs
from ._engine.caching import ResponseCache
from ._engine.client import InferenceClient
from ._engine.config import config_to_json
from ._engine.custom_metrics import CustomMetric, CustomMetricFamily, custom_metrics
from ._engine.datatypes import (TensorType, datatype_of, datatype_of_config, deserialize_bytes, from_wire_bytes,
                               serialize_bytes)
from ._engine.devices import visible_gpu_ids
from ._engine.errors import ServerError, Status
from ._engine.framework import FrameworkInstance
from ._engine.hookspecs import hookimpl
from ._engine.frontend.http.app import DEFAULT_MAX_INPUT_SIZE, http_asgi_app
from ._engine.inference import (InferenceRequest, InferenceResponse, RequestContent, RequestedOutput, ResponseContent,
                                Tensor)
from ._engine.options import AutoCompleteOptions, NoOptions, model_parameters, option, parse_bool, parse_options
from ._engine.protos.model_config_pb2 import (DataType, ModelConfig, ModelDynamicBatching, ModelInput,
                                              ModelInstanceGroup, ModelOptimizationPolicy, ModelOutput,
                                              ModelQueuePolicy, ModelSequenceBatching)
from ._engine.poll_window import PollWindow
from ._engine.registry import (BackendRegistry, CacheRegistry, CommandRegistry, RepositoryAgentRegistry,
                               SchedulerRegistry)
from ._engine.repo_agents import AgentAction, AgentModel, RepositoryAgent
from ._engine.scheduling import InstancePool, ModelContext, Scheduler
from ._engine.frontend.openai_listener import OpenAIOptions
from ._engine.frontend.frontends import FrontendOptions, Frontends
from ._engine.frontend.process import RemoteDataPlane
from ._engine.frontend_pool import serve_channel
from ._engine.seam import REMOTE_CALLS, DataPlaneAPI, ForwardingDataPlane, call_by_name, infer_one
from ._engine.server import Server, ServerOptions
from ._engine.sources import RepositorySource, is_version_name
from ._engine.statistics import ComputeTiming, mark_inputs_ready, mark_outputs_ready
from ._engine.wire import (ContentMeta, TensorLayout, TensorRef, WireError, content_type_names, decode_content,
                           decode_error, encode_content, encode_error, pack_content, pack_tensors, read_tensor,
                           tensor_from, use_content_types)

__all__ = [
    # hooks and registries
    "hookimpl", "BackendRegistry", "SchedulerRegistry", "CacheRegistry", "CommandRegistry",
    "RepositoryAgentRegistry",
    # backends: backend -> model -> instance
    "Backend", "ModelSpec", "Model", "InstanceSpec", "ModelInstance", "FrameworkInstance", "ComputeTiming",
    "mark_inputs_ready", "mark_outputs_ready",
    # requests, responses, tensors
    "InferenceRequest", "InferenceResponse", "RequestedOutput", "Tensor", "InferenceClient",
    "TensorType", "datatype_of", "datatype_of_config", "serialize_bytes", "deserialize_bytes", "from_wire_bytes",
    # requests, responses, tensors and errors across a process boundary (one binary form: wire.py)
    "RequestContent", "ResponseContent", "ContentMeta", "encode_content", "decode_content", "pack_content",
    "content_type_names", "use_content_types",
    "TensorRef", "TensorLayout", "pack_tensors", "read_tensor", "tensor_from", "WireError", "encode_error", "decode_error",
    # batches
    "concat_inputs", "split_outputs", "request_batch_size",
    # model configuration (Triton's model_config.proto messages)
    "ModelConfig", "DataType", "ModelInput", "ModelOutput", "ModelInstanceGroup", "ModelDynamicBatching",
    "ModelQueuePolicy", "ModelSequenceBatching", "ModelOptimizationPolicy", "config_to_json",
    # backend options (--backend-config) and model parameters, declared as dataclasses
    "option", "NoOptions", "AutoCompleteOptions", "parse_options", "parse_bool", "model_parameters",
    # errors
    "ServerError", "Status",
    # how long to busy-poll for what usually comes soon (a worker's answer), learnt from the waits
    "PollWindow",
    # schedulers, caches, repository sources
    "Scheduler", "ModelContext", "InstancePool", "ResponseCache", "RepositorySource", "is_version_name",
    # repository agents (model_repository_agents in config.pbtxt)
    "RepositoryAgent", "AgentModel", "AgentAction",
    # custom metrics, devices
    "CustomMetric", "CustomMetricFamily", "custom_metrics", "visible_gpu_ids",
    # embedding the server in another host (triton-serve-ray)
    "Server", "ServerOptions", "OpenAIOptions", "http_asgi_app", "DEFAULT_MAX_INPUT_SIZE", "DataPlaneAPI", "infer_one",
    # forwarding the data-plane seam to where the models are (triton-serve-ray's front door and replicas)
    "ForwardingDataPlane", "REMOTE_CALLS", "call_by_name",
    # the front-ends over a forwarder, and the binary channel to a model owner over TCP (triton-serve-ray)
    "Frontends", "FrontendOptions", "RemoteDataPlane", "serve_channel",
]
