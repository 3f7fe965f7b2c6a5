"""The scheduler API, and the instance pool every scheduler runs its batches through."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .backend import ModelInstance, ModelSpec
from .batch import request_batch_size
from .client import InferenceClient
from .errors import ServerError, Status, internal, unexpected
from .inference import InferenceRequest
from .ratelimit import RateLimiter, ResourceClaim
from .statistics import ModelStats, start_timing, stop_timing

if TYPE_CHECKING:
    from .protos.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)


class InstancePool:
    """The instances of one model version: hands out idle ones and runs batches on them.

    ``async with pool.acquire() as instance`` waits for an idle instance (one that can take another batch) (a ready one while any
    instance is ready, so a restarting instance gets no work); ``await pool.run(instance,
    requests)`` waits for the instance's rate-limiter resources, executes the batch and records
    statistics.
    """

    def __init__(self, model: ModelSpec, instances: Sequence[ModelInstance], *, stats: ModelStats | None = None,
                 limiter: RateLimiter | None = None) -> None:
        self.model = model
        self.instances = list(instances)
        self.stats = stats if stats is not None else ModelStats()
        self._limiter = limiter
        self._claims: dict[int, ResourceClaim] = {}
        if limiter is not None:
            claims = {id(i): limiter.claim(model.name, i.spec) for i in instances}  # checks the claims even when off
            if limiter.enabled:
                self._claims = claims
        # One entry per batch an instance may take at once (ModelInstance.max_batches_in_flight), every instance's
        # first before any second one: a batch goes to an instance with nothing to do while there is one.
        depth = max((i.max_batches_in_flight for i in self.instances), default=1)
        self._idle: deque[ModelInstance] = deque(i for k in range(depth) for i in self.instances
                                                 if k < max(i.max_batches_in_flight, 1))
        self.capacity = len(self._idle)  # batches the pool can run at once
        self._waiters: deque[asyncio.Future[ModelInstance]] = deque()

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[ModelInstance]:
        """Hold an idle instance for the ``async with`` block (waiting for one to be free)."""
        instance = await self._take()
        try:
            yield instance
        finally:
            self._give_back(instance)

    def _pick(self) -> ModelInstance | None:
        for instance in self._idle:
            if instance.is_ready():
                self._idle.remove(instance)
                return instance
        if self._idle and not any(i.is_ready() for i in self.instances):
            return self._idle.popleft()  # nothing is ready: let the request fail fast with the reason
        return None

    async def _take(self) -> ModelInstance:
        if not self._waiters:
            instance = self._pick()
            if instance is not None:
                return instance
        future: asyncio.Future[ModelInstance] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._give_back(future.result())
            with contextlib.suppress(ValueError):
                self._waiters.remove(future)
            raise

    def _give_back(self, instance: ModelInstance) -> None:
        self._idle.append(instance)
        while self._waiters:
            if self._waiters[0].done():
                self._waiters.popleft()
                continue
            picked = self._pick()
            if picked is None:
                return
            self._waiters.popleft().set_result(picked)

    async def run(self, instance: ModelInstance, requests: Sequence[InferenceRequest], *,
                  runner: ModelInstance | None = None) -> None:
        """Execute ``requests`` as one batch on ``instance``; every request ends with a final
        response. Requests cancelled while queued are answered CANCELLED and not executed.
        ``runner``, when given, wraps ``instance`` (e.g. to add state) and is called instead."""
        now = time.monotonic_ns()
        self.stats.dequeued += len(requests)
        live = []
        for request in requests:
            if request.cancelled.is_set():
                request.fail(ServerError(f"request to model '{request.model_name}' was cancelled", Status.CANCELLED))
            else:
                self.stats.record_queue(now - request.enqueued_ns)
                live.append(request)
        if not live:
            return
        claim = self._claims.get(id(instance))
        if claim is None:
            await self._execute(runner or instance, live)
            return
        await self._limiter.acquire(claim)  # type: ignore[union-attr]
        try:
            await self._execute(runner or instance, live)
        finally:
            self._limiter.release(claim)  # type: ignore[union-attr]

    async def execute(self, requests: Sequence[InferenceRequest]) -> None:
        """Wait for an idle instance and run ``requests`` on it."""
        instance = None if self._waiters else self._pick()
        if instance is None:
            instance = await self._take()
        try:
            await self.run(instance, requests)
        finally:
            self._give_back(instance)

    async def _execute(self, instance: ModelInstance, requests: list[InferenceRequest]) -> None:
        traces = [request.trace for request in requests if request.trace is not None]
        for trace in traces:  # held until the compute timestamps are in, whenever the responses go
            trace.hold()
        timing, token = start_timing()
        failure: ServerError | None
        try:
            responses = await instance.execute(requests)
        except ServerError as error:
            responses, failure = None, error
        except Exception as error:  # a backend bug must fail its requests, not the server
            log.exception("model '%s' failed to execute", requests[0].model_name)
            responses, failure = None, unexpected(error)
        else:
            failure = None
            if responses is not None and len(responses) != len(requests):
                failure = internal(f"model '{requests[0].model_name}' returned {len(responses)} responses "
                                   f"for {len(requests)} requests")
                responses = None
        finally:
            stop_timing(token)
            end_ns = time.monotonic_ns()
            for trace in traces:
                trace.computed(timing, end_ns)
        if failure is None:
            sizes = [request_batch_size(request, self.model.config) for request in requests]
            self.stats.record_execution(sizes, timing, end_ns)
        if responses is not None:
            for request, response in zip(requests, responses):
                if not request.finished:
                    request.send(response)
            return
        for request in requests:
            if failure is not None:
                request.fail(failure)
            elif not request.finished and not instance.answers_later:
                request.fail(internal(f"model '{request.model_name}' finished without a final response"))


@dataclass(frozen=True)
class ModelContext:
    """What the server gives one model version's scheduler: the version, its instance pool, its
    statistics, and a client that sends requests to other models through the one inference path."""

    model: ModelSpec
    pool: InstancePool
    stats: ModelStats
    client: InferenceClient


class Scheduler(ABC):
    """Decides when and on which instance each request of one model version runs.

    Registered per scheduling kind: "default" (no ``scheduling_choice`` in the config),
    "dynamic_batching", "sequence_batching" or "ensemble_scheduling"; created as
    ``factory(context)``. Runs on the event loop; runs batches through ``self.pool``
    (``pool.acquire()`` + ``pool.run()``, or ``pool.execute()``; an ensemble's pool is empty).
    """

    def __init__(self, context: ModelContext) -> None:
        self.context = context
        self.model = context.model
        self.pool = context.pool

    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        """Called (in a worker thread) when a model using this scheduling kind is read, after the
        core's checks and before it loads; raise ServerError with the reason its config cannot work."""

    @abstractmethod
    def enqueue(self, request: InferenceRequest) -> None:
        """Accept a validated request without blocking; its responses go through ``request.send``.
        Raise ServerError to reject it at once (for example a full queue)."""

    async def start(self) -> None:
        """Called after the instances are loaded, before the first request."""

    async def stop(self) -> None:
        """Stop accepting work and wait until every accepted request has been answered."""
