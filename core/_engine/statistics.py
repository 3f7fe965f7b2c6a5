"""Per-model-version inference statistics (Triton's statistics extension).

The data plane records each request's end (success or fail, measured from arrival) and
cache hits; ``InstancePool.run`` records queue and compute times per execution.
A backend may split its compute time into input, infer and output phases by calling
``mark_inputs_ready()`` and ``mark_outputs_ready()`` from inside ``execute`` (the batch
helpers in ``triton_serve._engine.batch`` do this); otherwise the whole call counts as infer.
Prometheus metrics (``triton_serve._engine.metrics``) read these counters at scrape time; only the
latency summaries and histograms that ``--metrics-config`` turns on add per-request work
(a ``LatencyRecorder``: one append, or one bisect and an integer increment, per observation).
"""
from __future__ import annotations

import bisect
import contextvars
import dataclasses
import logging
import math
import time
from collections import deque
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


def mark_inputs_ready(at_ns: int | None = None) -> None:
    """Inside ``ModelInstance.execute``: the batch's inputs are prepared; inference starts now (or started at
    ``at_ns``, a ``time.monotonic_ns()`` reading, which is the same clock in every process of the machine)."""
    timing = _current_timing.get()
    if timing is not None:
        timing.inputs_ready_ns = time.monotonic_ns() if at_ns is None else at_ns


def mark_outputs_ready(at_ns: int | None = None) -> None:
    """Inside ``ModelInstance.execute``: inference is done (or ended at ``at_ns``); what follows is output handling."""
    timing = _current_timing.get()
    if timing is not None:
        timing.outputs_ready_ns = time.monotonic_ns() if at_ns is None else at_ns


def start_timing() -> tuple[ComputeTiming, contextvars.Token[ComputeTiming | None]]:
    timing = ComputeTiming(time.monotonic_ns())
    return timing, _current_timing.set(timing)


def stop_timing(token: contextvars.Token[ComputeTiming | None]) -> None:
    _current_timing.reset(token)


# Triton's values of the ``reason`` label of nv_inference_request_failure.
FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")
# What a LatencyRecorder observes: Triton's summaries, our histograms (compute is input + infer + output),
# the cache's lookups and, for decoupled models, the time to the first response.
LATENCY_KINDS = ("request", "queue", "compute_input", "compute_infer", "compute_output", "compute",
                 "cache_hit", "cache_miss", "first_response")
SUMMARY_MAX_AGE_NS = 60_000_000_000  # prometheus-cpp's default summary window, which Triton uses
SUMMARY_MAX_SAMPLES = 65536  # a bound on the window's memory under heavy load


@dataclass(frozen=True)
class LatencySettings:
    """Which per-request latency distributions to keep (from ``--metrics-config``)."""

    summaries: bool = False
    histograms: bool = False
    buckets_us: tuple[float, ...] = ()  # histogram upper bounds, in microseconds
    first_response_buckets_ms: tuple[float, ...] = ()


# The one histogram family whose buckets a model's config.pbtxt may set (model_metrics, Triton 2.52).
CUSTOMIZABLE_HISTOGRAM = "nv_inference_first_response_histogram_ms"


def model_latency_settings(settings: LatencySettings | None, model_metrics: Any) -> LatencySettings | None:
    """``settings`` with the buckets a model's ``model_metrics { metric_control [...] }`` sets (Triton 2.52):
    each control naming a customizable family replaces that family's buckets; another family is warned about
    and skipped, as Triton's core does."""
    if settings is None:
        return None
    for control in model_metrics.metric_control:
        family = control.metric_identifier.family
        if family != CUSTOMIZABLE_HISTOGRAM:
            logging.getLogger("triton_serve").warning(
                "Metric family '%s' in 'metric_identifier' is not a customizable metric in Triton core.", family)
            continue
        buckets = tuple(sorted(set(control.histogram_options.buckets)))
        settings = dataclasses.replace(settings, first_response_buckets_ms=buckets)
    return settings


class Histogram:
    """Counts per bucket (the last one is +Inf) and the sum of the observed values."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count


class SummaryWindow:
    """Triton's summaries: a count and sum since start, quantiles over the last minute's observations."""

    __slots__ = ("count", "sum", "recent")

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.recent: deque[tuple[int, float]] = deque(maxlen=SUMMARY_MAX_SAMPLES)

    def observe(self, value: float, now_ns: int, count: int = 1) -> None:
        self.count += count
        self.sum += value * count
        for _ in range(count):
            self.recent.append((now_ns, value))

    def quantiles(self, wanted: list[float], now_ns: int) -> list[float]:
        """The ``wanted`` quantiles of the last minute (NaN when it saw nothing, as prometheus-cpp)."""
        while self.recent and now_ns - self.recent[0][0] > SUMMARY_MAX_AGE_NS:
            self.recent.popleft()
        values = sorted(value for _, value in self.recent)
        if not values:
            return [math.nan] * len(wanted)
        return [values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))] for q in wanted]


class LatencyRecorder:
    """Per-request latency distributions of one model version; exists only when enabled."""

    __slots__ = ("summaries", "histograms")

    def __init__(self, settings: LatencySettings) -> None:
        self.summaries = {kind: SummaryWindow() for kind in LATENCY_KINDS} if settings.summaries else None
        self.histograms: dict[str, Histogram] | None = None
        if settings.histograms:
            self.histograms = {kind: Histogram(settings.buckets_us) for kind in ("request", "queue", "compute")}
            self.histograms["first_response"] = Histogram(settings.first_response_buckets_ms)

    def observe(self, kind: str, ns: int, count: int = 1) -> None:
        """``count`` requests took ``ns`` nanoseconds in ``kind`` (histograms: µs, first response: ms)."""
        if self.summaries is not None and kind != "compute":
            self.summaries[kind].observe(ns / 1000, time.monotonic_ns(), count)
        if self.histograms is not None:
            histogram = self.histograms.get(kind)
            if histogram is not None:
                # Triton observes the first response in whole milliseconds (integer nanoseconds / 10^6).
                histogram.observe(ns // 1_000_000 if kind == "first_response" else ns / 1000, count)


class ModelStats:
    """The counters Triton reports for one model version."""

    def __init__(self, latency: LatencySettings | None = None) -> None:
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
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)  # fail.count by Triton's reason
        # Set by a scheduler whose failed requests Triton counts under one reason, whatever failed them
        # (an ensemble's: OTHER); None counts each failure under the reason given to ``record_end``.
        self.failure_reason: str | None = None
        self.enqueued = 0  # requests handed to the scheduler ...
        self.dequeued = 0  # ... and taken from its queue to run (or dropped, cancelled): the difference is pending
        self.load_seconds = 0.0
        self.latency = LatencyRecorder(latency) if latency is not None and (
            latency.summaries or latency.histograms) else None

    @property
    def pending(self) -> int:
        """Requests waiting in the scheduler's queue (nv_inference_pending_request_count)."""
        return max(0, self.enqueued - self.dequeued)

    def record_end(self, arrival_ns: int, ok: bool, reason: str = "OTHER") -> None:
        """A request got its final response (``ok``) or failed (for ``reason``, one of FAILURE_REASONS),
        ``arrival_ns`` after it arrived."""
        ns = time.monotonic_ns() - arrival_ns
        if ok:
            self.success.add(ns)
            self.last_inference_ms = time.time_ns() // 1_000_000
            if self.latency is not None:
                self.latency.observe("request", ns)
        else:
            self.fail.add(ns)
            self.failures[self.failure_reason or reason] += 1

    def record_cache(self, hit: bool, ns: int) -> None:
        """A response cache lookup that took ``ns``. A hit also counts as a request that waited no time in
        the queue, as in Triton, whose queue statistics and summary include cached requests."""
        (self.cache_hit if hit else self.cache_miss).add(ns)
        if hit:
            self.record_queue(0)
        if self.latency is not None:
            self.latency.observe("cache_hit" if hit else "cache_miss", ns)

    def record_queue(self, queued_ns: int) -> None:
        self.queue.add(queued_ns)
        if self.latency is not None:
            self.latency.observe("queue", queued_ns)

    def record_execution(self, request_batch_sizes: list[int], timing: ComputeTiming, end_ns: int) -> None:
        """One execution of ``len(request_batch_sizes)`` requests, which hold that many inferences."""
        input_ns, infer_ns, output_ns = timing.phases(end_ns)
        requests = len(request_batch_sizes)
        self.compute_input.add(input_ns * requests, requests)
        self.compute_infer.add(infer_ns * requests, requests)
        self.compute_output.add(output_ns * requests, requests)
        batch_size = sum(request_batch_sizes)
        stats = self.batch_stats.get(batch_size)
        if stats is None:
            stats = self.batch_stats[batch_size] = BatchStats()
        stats.compute_input.add(input_ns)
        stats.compute_infer.add(infer_ns)
        stats.compute_output.add(output_ns)
        self.inference_count += batch_size
        self.execution_count += 1
        latency = self.latency
        if latency is not None:
            for kind, ns in (("compute_input", input_ns), ("compute_infer", infer_ns),
                             ("compute_output", output_ns), ("compute", input_ns + infer_ns + output_ns)):
                latency.observe(kind, ns, requests)

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
