"""The protocol-neutral data plane: every HTTP and gRPC handler calls these methods."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from .. import __version__
from .caching import ResponseCache
from .config import config_to_json
from .datatypes import name_of_config_type
from .errors import ServerError, Status, internal, unexpected, unsupported
from .inference import InferenceRequest, InferenceResponse
from .load_overrides import parse_load_parameters
from .log_settings import LogControl
from .protos.model_config_pb2 import ModelConfig
from .repository import ModelRepository, ModelVersion
from .shared_memory import SharedMemoryRegistry
from .shared_memory_tensors import SharedMemoryLease, detached
from .trace_settings import SettingUpdate
from .tracing import Tracer

log = logging.getLogger(__name__)


class DataPlane:
    """Health, metadata, inference and repository control, independent of the wire protocol.

    It answers the seam every front-end calls (``seam.DataPlaneAPI``; ``RemoteDataPlane`` forwards it from
    front-end processes). Inference has one path: ``submit`` reads inputs that name a shared-memory region,
    validates the request, answers it from the response cache or hands it to the model's scheduler,
    and passes every response through the version's output shaping, statistics and shared-memory
    outputs on its way to the consumer.
    """

    def __init__(self, repository: ModelRepository, *, strict_readiness: bool = True,
                 extensions: list[str] | None = None, cache: ResponseCache | None = None,
                 control_mode: str = "none", server_id: str = "triton",
                 log_control: LogControl | None = None, tracer: Tracer | None = None) -> None:
        self.repository = repository
        repository.client.bind(self.submit)  # models and schedulers reach other models through submit
        self.tracer = tracer or Tracer()
        self.trace_armed = self.tracer.armed  # front-ends note their trace timestamps only while True
        self.tracer.subscribe(self._arm_tracing)
        self.log_control = log_control or LogControl()
        self.server_id = server_id  # the metadata's "name" (tritonserver --id)
        self.control_mode = control_mode
        self.strict_readiness = strict_readiness
        self.extensions = extensions if extensions is not None else []
        self.cache = cache
        self._fetches: set[asyncio.Task[None]] = set()  # a remote cache's lookups in flight
        self.shared_memory = SharedMemoryRegistry()
        self.is_live = True
        self.accepting = True
        self.metrics_exposition: Callable[[], bytes] | None = None  # the metrics port's text; None: metrics off

    # ---- health and metadata ----------------------------------------------------------------

    async def live(self) -> bool:
        return self.is_live

    async def server_ready(self) -> bool:
        if not (self.is_live and self.accepting):
            return False
        return await self.repository.check_ready() if self.strict_readiness else True

    async def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_id, "version": __version__, "extensions": list(self.extensions)}

    async def model_ready(self, name: str, version: int | None = None) -> bool:
        try:
            found = self.repository.get_version(name, version)
        except ServerError:
            return False
        return await found.check_ready()

    async def model_metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        found = self.repository.get_version(name, version)
        config = found.config
        model = self.repository.record(name)
        batch = [-1] if config.max_batch_size > 0 else []

        def describe(tensors: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": name_of_config_type(t.data_type), "shape": batch + list(t.dims)}
                    for t in tensors]

        return {
            "name": name,
            "versions": [str(v.version) for v in sorted(model.versions.values(), key=lambda v: v.version)
                         if v.is_ready()],
            "platform": config.platform or config.backend,
            "inputs": describe(config.input),
            "outputs": describe(config.output),
        }

    async def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        return self.repository.get_version(name, version).config

    async def model_config_json(self, name: str, version: int | None = None) -> dict[str, Any]:
        return config_to_json(self.repository.get_version(name, version).config)

    async def is_decoupled(self, name: str, version: int | None = None) -> bool:
        return self.repository.get_version(name, version).route.decoupled

    # ---- inference --------------------------------------------------------------------------

    def submit(self, request: InferenceRequest, *, decoupled_error: str | None = None) -> None:
        """Start a request; its 0..N responses reach the request's sink (or ``request.responses()``).

        Raises ServerError when the request cannot start (unknown model, invalid input, full
        queue). ``decoupled_error`` is a unary front-end's message for a decoupled model, which it
        cannot serve; streams pass None.
        """
        found = self.repository.get_version(request.model_name, request.model_version)
        route = found.route
        if decoupled_error is not None and route.decoupled:
            raise unsupported(decoupled_error)
        request.model_version = found.version
        stats = found.stats
        lease = SharedMemoryLease.take(self.shared_memory, request)
        if request.trace is not None or self.trace_armed:
            self.tracer.sample(request)
        try:
            route.validate(request)
            key = self._cache_key(found, request) if self.cache is not None and route.cacheable else None
            cached = None
            if key is not None:
                if self.cache.remote:  # type: ignore[union-attr]
                    task = asyncio.get_running_loop().create_task(self._fetch_then_start(found, request, key, lease))
                    self._fetches.add(task)
                    task.add_done_callback(self._fetches.discard)
                    return
                started = time.monotonic_ns()
                cached = self.cache.lookup(key)  # type: ignore[union-attr]
                stats.record_cache(cached is not None, time.monotonic_ns() - started)
            self._start(found, request, key, lease, cached)
        except Exception as error:
            raise self._refused(found, request, lease, error) from None

    def _start(self, found: ModelVersion, request: InferenceRequest, key: str | None,
               lease: SharedMemoryLease | None, cached: InferenceResponse | None) -> None:
        """Answer ``request`` with the ``cached`` response, or queue it for its model (a miss stores the response
        under ``key``). Raises what the scheduler raises."""
        if cached is not None:
            if lease is not None:
                cached = lease.write_outputs(cached)
                lease.release()
            found.stats.record_end(request.arrival_ns, cached.error is None)
            if request.trace is not None:
                request.trace.responded(None, True)
            request.send(cached)
            return
        if found.scheduler is None:
            raise internal(f"model '{request.model_name}' version {found.version} has no scheduler")
        request.set_filter(_ResponseFinisher(found, self.cache if key is not None else None, key, lease))
        request.enqueued_ns = time.monotonic_ns()
        if request.trace is not None:
            request.trace.queued(request)
        found.scheduler.enqueue(request)
        found.stats.enqueued += 1

    def _refused(self, found: ModelVersion, request: InferenceRequest, lease: SharedMemoryLease | None,
                 error: Exception) -> ServerError:
        """Account for a request that could not start, and the error to answer it with."""
        failure = error if isinstance(error, ServerError) else unexpected(error)
        if failure is not error:  # a bug in a scheduler, the cache or the checks
            log.error("model '%s' could not take a request", request.model_name, exc_info=error)
        if failure.status is not Status.UNAVAILABLE:  # the scheduler refused it (full queue): Triton counts nothing
            found.stats.record_end(request.arrival_ns, False, failure_reason(failure.status, in_backend=False))
        if lease is not None:
            lease.release()
        if request.trace is not None:
            request.trace.responded(None, True)
        return failure

    async def _fetch_then_start(self, found: ModelVersion, request: InferenceRequest, key: str,
                                lease: SharedMemoryLease | None) -> None:
        """A remote cache's lookup, then the hit or the queue. The request has already started for its front-end,
        so a refusal (a full queue) becomes its error response."""
        started = time.monotonic_ns()
        try:
            cached = await self.cache.fetch(key)  # type: ignore[union-attr]
        except Exception as error:  # the cache broke its promise not to raise: run uncached
            log.error("the response cache failed a lookup", exc_info=error)
            cached = None
        found.stats.record_cache(cached is not None, time.monotonic_ns() - started)
        try:
            self._start(found, request, key, lease, cached)
        except Exception as error:
            failure = self._refused(found, request, lease, error)
            request.set_filter(_unfiltered)  # not the finisher: the refusal is accounted for
            request.fail(failure)

    def _cache_key(self, found: ModelVersion, request: InferenceRequest) -> str:
        digest = hashlib.sha256(f"{request.model_name}\0{found.version}".encode())
        for tensor in sorted(request.inputs.values(), key=lambda t: t.name):
            digest.update(f"\0{tensor.name}\0{tensor.datatype}\0{tensor.shape}\0".encode())
            digest.update(tensor.wire_bytes())  # the same bytes whichever protocol or form the tensor came in
        for output in request.outputs:
            digest.update(f"\0out\0{output.name}\0{sorted(output.parameters.items())}".encode())
        return digest.hexdigest()

    # ---- statistics -------------------------------------------------------------------------

    async def model_statistics(self, name: str = "", version: int | None = None) -> list[dict[str, Any]]:
        """Triton's ``model_stats`` entries: every loaded version of every model when ``name`` is
        empty, else the named model's (one version when given, else each ready version)."""
        if not name:
            if version is not None:
                raise ServerError("statistics for a model version need the model name")
            return [found.stats.as_dict(self.repository.models[key].name, found.version)
                    for key in sorted(self.repository.models)
                    for found in self._versions_with_stats(key)]
        if version is not None:
            found = self.repository.get_version(name, version)
            return [found.stats.as_dict(name, found.version)]
        self.repository.get_version(name)  # the model must exist and be ready
        return [found.stats.as_dict(name, found.version) for found in self._versions_with_stats(name)]

    def _versions_with_stats(self, name: str) -> list[ModelVersion]:
        model = self.repository.record(name)
        return sorted((v for v in model.versions.values() if v.is_ready()), key=lambda v: v.version)

    # ---- shared memory ----------------------------------------------------------------------

    async def register_system_shared_memory(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.shared_memory.register_system(name, key, offset, byte_size)

    async def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int,
                                          byte_size: int) -> None:
        self.shared_memory.register_cuda(name, raw_handle, device_id, byte_size)

    async def shared_memory_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        """Triton's status entries for the ``kind`` ("system" or "cuda") regions, or the one named."""
        return self.shared_memory.status(kind, name)

    async def unregister_shared_memory(self, kind: str, name: str = "") -> None:
        """Unregister one region (every one of ``kind`` without a name); one a request uses stays, and the
        call fails with Triton's INTERNAL error."""
        await self.shared_memory.unregister(kind, name)

    # ---- repository -------------------------------------------------------------------------

    async def repository_index(self, ready_only: bool = False, repository: str = "") -> list[dict[str, str]]:
        """The index of every repository, or of those named ``repository``."""
        return await self.repository.index(ready_only, repository)

    def _check_explicit(self) -> None:
        if self.control_mode != "explicit":
            raise ServerError("explicit model load / unload is not allowed if polling is enabled",
                              Status.UNAVAILABLE)

    async def load_model(self, name: str, parameters: dict[str, Any], repository: str = "") -> None:
        """Load or reload a model (explicit mode only), with the ``config`` / ``file:`` overrides in
        ``parameters`` (file contents as bytes); raise with the reason if it fails."""
        self._check_explicit()
        override = parse_load_parameters(name, parameters)
        failure = (await self.repository.load(name, override, repository)).failure()
        if failure:
            raise ServerError(failure)

    async def unload_model(self, name: str, unload_dependents: bool = False, repository: str = "") -> None:
        """Unload a model (explicit mode only) and, with ``unload_dependents``, the models using it."""
        self._check_explicit()
        await self.repository.unload(name, unload_dependents=unload_dependents, repository=repository)

    # ---- metrics ----------------------------------------------------------------------------

    async def metrics_text(self) -> bytes:
        if self.metrics_exposition is None:
            raise ServerError("metrics are not enabled (--allow-metrics=false)", Status.UNAVAILABLE)
        return self.metrics_exposition()

    # ---- logging ----------------------------------------------------------------------------

    async def log_settings(self) -> dict[str, Any]:
        return self.log_control.settings.as_dict()

    async def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Change the named log settings in every process of the server (all or none); the settings now."""
        return (await self.log_control.update(changes)).as_dict()

    # ---- tracing ----------------------------------------------------------------------------

    async def trace_setting(self, model_name: str = "", update: SettingUpdate | None = None) -> dict[str, list[str]]:
        """Triton's trace extension: apply ``update`` (when given) to the model's or the global trace
        setting, then return the settings in force, each as a list of strings."""
        if model_name and not await self.model_ready(model_name):
            raise ServerError(f"Request for unknown model : {model_name}")
        if update is not None:
            await self.tracer.update(model_name, update)
        return self.tracer.settings(model_name)

    def _arm_tracing(self, armed: bool) -> None:
        self.trace_armed = armed


def failure_reason(status: Status, *, in_backend: bool) -> str:
    """Triton's ``reason`` label for a failed request: REJECTED (its queue timeout expired), CANCELED,
    BACKEND (the model's execution failed) or OTHER (e.g. invalid input). A request its scheduler
    refuses to queue (``max_queue_size``, unloading) is not counted at all, as in Triton."""
    if status is Status.CANCELLED:
        return "CANCELED"
    if status is Status.UNAVAILABLE:
        return "REJECTED"
    return "BACKEND" if in_backend else "OTHER"


def _unfiltered(request: InferenceRequest, response: InferenceResponse | None,
                final: bool) -> InferenceResponse | None:
    return response


class _ResponseFinisher:
    """Between a backend's ``send`` and the consumer: shape outputs, fill the cache, write outputs into
    shared memory, record statistics; the final response releases the request's regions."""

    __slots__ = ("found", "cache", "key", "lease", "ok", "reason", "first")

    def __init__(self, found: ModelVersion, cache: ResponseCache | None, key: str | None,
                 lease: SharedMemoryLease | None) -> None:
        self.found = found
        self.cache = cache
        self.key = key
        self.lease = lease
        self.ok = True
        self.reason = "OTHER"  # why it failed, once ok is False
        # Each model's time to first response goes to a histogram when histograms are on (every model since
        # Triton 2.65; decoupled ones only in 2.52 to 2.64).
        latency = found.stats.latency
        self.first = latency is not None and latency.histograms is not None

    def __call__(self, request: InferenceRequest, response: InferenceResponse | None,
                 final: bool) -> InferenceResponse | None:
        if request.trace is not None:
            request.trace.responded(response, final)
        if response is not None:
            if response.error is None:
                try:
                    response = self.found.route.shape(request, response)
                except ServerError as error:
                    response = InferenceResponse.from_error(error)
                except Exception as error:  # a bug must fail the request, not leave its client waiting
                    log.exception("shaping the response of model '%s' failed", request.model_name)
                    response = InferenceResponse.from_error(unexpected(error))
            lease = self.lease
            if response.error is None and self.cache is not None:
                cached = detached(response) if lease is not None and lease.views else response
                self.cache.insert(self.key, cached)  # type: ignore[arg-type]
            if response.error is None and lease is not None:
                response = lease.write_outputs(response)
            if response.error is not None and self.ok:
                self.ok = False
                self.reason = failure_reason(response.error.status, in_backend=True)
            if self.first:
                self.first = False
                self.found.stats.latency.observe(  # type: ignore[union-attr]
                    "first_response", time.monotonic_ns() - request.arrival_ns)
        if final:
            self.found.stats.record_end(request.arrival_ns, self.ok, self.reason)
            if self.lease is not None:
                self.lease.release()
        return response
