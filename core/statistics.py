"""Per-model-version inference statistics (Triton's statistics extension).

The data plane records each request's end (success or fail, measured from arrival) and
cache hits; ``InstancePool.run`` records queue and compute times per execution.
A backend may split its compute time into input, infer and output phases by calling
``mark_inputs_ready()`` and ``mark_outputs_ready()`` from inside ``execute`` (the batch
helpers in ``triton_serve.batch`` do this); otherwise the whole call counts as infer.
"""
from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Duration:
    """A count of events and their summed duration in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStats:
    """Compute durations of the executions of one batch size."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ComputeTiming:
    """Timestamps (monotonic ns) of one execution; the phase marks are optional."""

    start_ns: int
    inputs_ready_ns: int | None = None
    outputs_ready_ns: int | None = None

    def phases(self, end_ns: int) -> tuple[int, int, int]:
        """(input, infer, output) durations in ns."""
        inputs_ready = self.inputs_ready_ns if self.inputs_ready_ns is not None else self.start_ns
        outputs_ready = self.outputs_ready_ns if self.outputs_ready_ns is not None else end_ns
        return inputs_ready - self.start_ns, outputs_ready - inputs_ready, end_ns - outputs_ready


_current_timing: contextvars.ContextVar[ComputeTiming | None] = contextvars.ContextVar(
    "triton_serve_compute_timing", default=None)


def mark_inputs_ready() -> None:
    """Inside ``ModelInstance.execute``: the batch's inputs are prepared; inference starts now."""
    timing = _current_timing.get()
    if timing is not None:
        timing.inputs_ready_ns = time.monotonic_ns()


def mark_outputs_ready() -> None:
    """Inside ``ModelInstance.execute``: inference is done; what follows is output handling."""
    timing = _current_timing.get()
    if timing is not None:
        timing.outputs_ready_ns = time.monotonic_ns()


def start_timing() -> tuple[ComputeTiming, contextvars.Token[ComputeTiming | None]]:
    timing = ComputeTiming(time.monotonic_ns())
    return timing, _current_timing.set(timing)


def stop_timing(token: contextvars.Token[ComputeTiming | None]) -> None:
    _current_timing.reset(token)


class ModelStats:
    """The counters Triton reports for one model version."""

    def __init__(self) -> None:
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.cache_hit = Duration()
        self.cache_miss = Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batch_stats: dict[int, BatchStats] = {}

    def record_end(self, arrival_ns: int, ok: bool) -> None:
        """A request got its final response (``ok``) or failed, ``arrival_ns`` after it arrived."""
        (self.success if ok else self.fail).add(time.monotonic_ns() - arrival_ns)
        if ok:
            self.last_inference_ms = time.time_ns() // 1_000_000

    def record_queue(self, queued_ns: int) -> None:
        self.queue.add(queued_ns)

    def record_execution(self, request_batch_sizes: list[int], timing: ComputeTiming, end_ns: int) -> None:
        """One execution of ``len(request_batch_sizes)`` requests, which hold that many inferences."""
        input_ns, infer_ns, output_ns = timing.phases(end_ns)
        requests = len(request_batch_sizes)
        for total, ns in ((self.compute_input, input_ns), (self.compute_infer, infer_ns),
                          (self.compute_output, output_ns)):
            total.add(ns * requests, requests)
        batch_size = sum(request_batch_sizes)
        stats = self.batch_stats.setdefault(batch_size, BatchStats())
        stats.compute_input.add(input_ns)
        stats.compute_infer.add(infer_ns)
        stats.compute_output.add(output_ns)
        self.inference_count += batch_size
        self.execution_count += 1

    def as_dict(self, name: str, version: int) -> dict[str, Any]:
        """The JSON shape of one entry of ``model_stats`` (numbers as the HTTP endpoint returns them)."""
        return {
            "name": name,
            "version": str(version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {key: getattr(self, key).as_dict() for key in (
                "success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                "cache_hit", "cache_miss")},
            "response_stats": {},
            "batch_stats": [
                {"batch_size": size, "compute_input": stats.compute_input.as_dict(),
                 "compute_infer": stats.compute_infer.as_dict(),
                 "compute_output": stats.compute_output.as_dict()}
                for size, stats in sorted(self.batch_stats.items())],
            "memory_usage": [],
        }
