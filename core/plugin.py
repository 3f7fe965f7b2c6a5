"""The public API for plugin authors: import everything a plugin needs from here."""
from __future__ import annotations

from .backend import Backend, InstanceSpec, ModelInstance, ModelSpec
from .caching import ResponseCache
from .errors import ServerError, Status
from .hookspecs import hookimpl
from .inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from .registry import BackendRegistry, CacheRegistry, SchedulerRegistry
from .scheduling import InstancePool, Scheduler
from .sources import RepositorySource

__all__ = [
    "Backend", "BackendRegistry", "CacheRegistry", "InferenceRequest", "InferenceResponse", "InstancePool",
    "InstanceSpec", "ModelInstance", "ModelSpec", "RepositorySource", "RequestedOutput", "ResponseCache",
    "Scheduler", "SchedulerRegistry", "ServerError", "Status", "Tensor", "hookimpl",
]
