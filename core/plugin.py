"""The public API for plugin authors: import everything a plugin needs from here."""
from __future__ import annotations

from .backend import Backend, InstanceSpec, ModelInstance, ModelSpec
from .caching import ResponseCache
from .client import InferenceClient
from .custom_metrics import CustomMetric, CustomMetricFamily, custom_metrics
from .errors import ServerError, Status
from .hookspecs import hookimpl
from .inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from .registry import BackendRegistry, CacheRegistry, SchedulerRegistry
from .scheduling import InstancePool, ModelContext, Scheduler
from .sources import RepositorySource, is_version_name
from .statistics import ComputeTiming

__all__ = [
    "Backend", "BackendRegistry", "CacheRegistry", "ComputeTiming", "CustomMetric", "CustomMetricFamily",
    "InferenceClient", "InferenceRequest", "InferenceResponse", "InstancePool", "InstanceSpec", "ModelContext",
    "ModelInstance", "ModelSpec", "RepositorySource",
    "RequestedOutput", "ResponseCache", "Scheduler", "SchedulerRegistry", "ServerError", "Status", "Tensor",
    "custom_metrics", "hookimpl", "is_version_name",
]
