"""The ensemble scheduler: runs each request's steps as soon as their inputs exist, through the
server's one inference path, and answers with the ensemble's outputs."""
from __future__ import annotations

import asyncio
import contextlib
import time

from triton_serve.plugin import (ComputeTiming, InferenceRequest, InferenceResponse, ModelConfig, ModelContext,
                                 Scheduler, ServerError, Status, Tensor)

from .steps import SequenceFields, Slot, StepGraph, response_parameters, step_model
from .validation import check_scheduling, check_steps


class EnsembleScheduler(Scheduler):
    """Scheduler for ``ensemble_scheduling``. Each request runs as one task on the event loop; its step
    requests go to the composing models' own schedulers (batching, statistics and rate limits apply);
    intermediate tensors stay numpy arrays in this process. ``max_inflight_requests`` bounds the
    requests in flight at each step across all of this ensemble's requests (a step waits for room).

    As Triton 2.51 counts them, a failed ensemble request counts twice in the ensemble's failures
    (``fail`` and ``nv_inference_request_failure``), both with reason OTHER whatever failed it: once
    for its error response, once when its last step request is released. The failing step's model
    counts its own failure (REJECTED for a queue timeout; nothing for a full queue)."""

    def __init__(self, context: ModelContext) -> None:
        super().__init__(context)
        config = context.model.config
        self.graph = StepGraph(config)
        limit = config.ensemble_scheduling.max_inflight_requests
        self.room = [asyncio.Semaphore(limit) if limit else None for _ in self.graph.steps]
        self.decoupled_steps: set[int] = set()
        context.stats.failure_reason = "OTHER"
        self._runs: set[asyncio.Task[None]] = set()
        self._stopping = False

    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        check_scheduling(config)

    async def start(self) -> None:
        """Check each step against its model's completed config (loaded before the ensemble) and mark
        the ensemble decoupled when a step's model is, as Triton does."""
        client, config = self.context.client, self.model.config
        composing = {}
        for step in self.graph.steps:
            version = None if step.model_version == -1 else step.model_version
            composing[step.model_name] = client.model_config(step_model(step), version)
        decoupled = check_steps(config, composing)
        config.model_transaction_policy.decoupled = decoupled
        self.decoupled_steps = {index for index, step in enumerate(self.graph.steps)
                                 if composing[step.model_name].model_transaction_policy.decoupled}

    def enqueue(self, request: InferenceRequest) -> None:
        if self._stopping:
            raise ServerError(f"ensemble '{self.model.name}' is unloading", Status.UNAVAILABLE)
        self.context.stats.dequeued += 1  # nothing waits in a queue: the run starts now
        task = asyncio.get_running_loop().create_task(_EnsembleRun(self, request).serve())
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)

    async def stop(self) -> None:
        self._stopping = True
        if self._runs:
            await asyncio.gather(*self._runs, return_exceptions=True)


class _EnsembleRun:
    """One ensemble request: the steps its requested outputs need (Triton prunes the others per request),
    its tensors, its step requests in flight, and whether it has failed."""

    def __init__(self, scheduler: EnsembleScheduler, request: InferenceRequest) -> None:
        self.scheduler = scheduler
        self.request = request
        self.graph = scheduler.graph
        self.decoupled = scheduler.model.config.model_transaction_policy.decoupled
        self.wanted = {o.name for o in request.outputs} or {t.name for t in scheduler.model.config.output}
        self.needed = self.graph.needed(frozenset(self.wanted))
        self.in_flight: set[InferenceRequest] = set()
        self.error: ServerError | None = None

    async def serve(self) -> None:
        request, stats = self.request, self.scheduler.context.stats
        start_ns = time.monotonic_ns()
        stats.record_queue(start_ns - request.enqueued_ns)
        self._watch_cancel()
        try:
            await self.flow(self.graph.initial(request), set(self.needed), set(request.inputs))
        except Exception as error:  # a bug here must fail the request, not leave it hanging
            self.fail(ServerError(f"ensemble '{request.model_name}' failed: {type(error).__name__}: {error}",
                                  Status.INTERNAL))
        if self.error is None:
            stats.record_execution([self.graph.batch_size(request)], ComputeTiming(start_ns), time.monotonic_ns())
            if self.decoupled:
                request.send(None, final=True)

    def _watch_cancel(self) -> None:
        """Fail this run when the ensemble request is cancelled (chained before any earlier ``on_cancel``)."""
        request = self.request
        earlier = request.on_cancel

        def cancelled() -> None:
            self.fail(ServerError(f"request to model '{request.model_name}' was cancelled", Status.CANCELLED))
            if earlier is not None:
                earlier()

        request.on_cancel = cancelled
        if request.cancelled.is_set():
            cancelled()

    def fail(self, error: ServerError) -> None:
        """Fail the ensemble request with ``error`` (the first failure wins) and cancel its step requests."""
        if self.error is not None or self.request.finished:
            return
        self.error = error
        self.scheduler.context.stats.record_end(self.request.arrival_ns, False)  # Triton's count at release
        self.request.fail(error)
        for step_request in list(self.in_flight):
            step_request.cancel()

    def fail_step(self, error: ServerError) -> None:
        """Fail the ensemble request with a step's error, named as Triton names it (``in ensemble 'e', ...``)."""
        self.fail(ServerError(f"in ensemble '{self.request.model_name}', {error.message}", error.status))

    async def flow(self, tensors: dict[str, Slot], steps: set[int], produced: set[str]) -> None:
        """Run ``steps`` as their inputs appear in ``tensors``; independent steps run concurrently. A
        decoupled step's responses each continue the steps downstream of it in a flow of their own.
        Once done, send the ensemble outputs this flow produced (``produced`` holds those it starts with)."""
        running: set[asyncio.Future[dict[str, Slot]]] = set()
        started: set[int] = set()
        try:
            while self.error is None:
                ready = [index for index in sorted(steps - started) if self.graph.is_ready(index, tensors)]
                started.update(ready)
                for index in ready:
                    if index in self.scheduler.decoupled_steps:
                        steps -= self.graph.downstream(index)
                if len(ready) == 1 and not running:  # a chain: run the step here, no task needed
                    outputs = await self.run_step(ready[0], tensors)
                    tensors.update(outputs)
                    produced.update(outputs)
                    continue
                running.update(asyncio.ensure_future(self.run_step(index, tensors)) for index in ready)
                if not running:
                    break
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    outputs = task.result()
                    tensors.update(outputs)
                    produced.update(outputs)
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        if self.error is None:
            self.respond(tensors, produced)

    def respond(self, tensors: dict[str, Slot], produced: set[str]) -> None:
        """Send the requested outputs among ``produced``; one a step left out is left out of the response
        too. As Triton does, the response carries the sequence fields its tensors were made with."""
        outputs: list[Tensor] = []
        sequence: SequenceFields | None = None
        for name in sorted(self.wanted & produced):
            slot = tensors.get(name)
            if slot is not None and slot.tensor is not None:
                outputs.append(slot.tensor)
                if slot.sequence is not None:
                    sequence = slot.sequence
        response = InferenceResponse(outputs)
        if sequence is not None:
            response.parameters = response_parameters(self.request, sequence)
        if self.decoupled:
            if outputs:
                self.request.send(response, final=False)
        else:
            self.request.send(response)

    async def run_step(self, index: int, tensors: dict[str, Slot]) -> dict[str, Slot]:
        """Send step ``index`` its inputs; return its outputs as ensemble tensors (a decoupled step's
        responses are consumed here, each by a flow over the needed steps downstream of it)."""
        room = self.scheduler.room[index]
        async with room if room is not None else contextlib.nullcontext():
            step_request = self.graph.step_request(index, self.request, tensors)
            sequence = SequenceFields.of(step_request)
            self.in_flight.add(step_request)
            try:
                try:
                    self.scheduler.context.client.submit(step_request, parent=self.request)
                except ServerError as error:
                    self.fail_step(error)
                    return {}
                decoupled = index in self.scheduler.decoupled_steps
                async for response, _final in step_request.responses():
                    if response is None:
                        continue
                    if response.error is not None:
                        self.fail_step(response.error)
                        return {}
                    try:
                        outputs = self.graph.step_outputs(index, response, sequence)
                    except ServerError as error:
                        self.fail_step(error)
                        return {}
                    if not decoupled:
                        return outputs
                    await self.flow({**tensors, **outputs}, set(self.graph.downstream(index) & self.needed),
                                    set(outputs))
                    if self.error is not None:
                        return {}
                return {}
            finally:
                self.in_flight.discard(step_request)
                if self.error is not None or not step_request.finished:
                    step_request.cancel()
