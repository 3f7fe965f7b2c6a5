"""Prometheus metrics with Triton's names, built at scrape time from each model version's ModelStats."""
from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from .errors import ServerError
from .statistics import FAILURE_REASONS, LatencySettings, ModelStats

if TYPE_CHECKING:
    from .repository import ModelRepository
    from .system_metrics import SystemSampler

# Triton's default summary quantiles (prometheus-cpp <quantile>:<error> pairs).
DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
# Our latency histograms' default upper bounds, in microseconds: 100 µs to 10 s.
DEFAULT_BUCKETS_US = (100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 25000.0, 50000.0, 100000.0,
                      250000.0, 500000.0, 1000000.0, 2500000.0, 5000000.0, 10000000.0)
# Triton's default buckets of nv_inference_first_response_histogram_ms.
DEFAULT_FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)
FLAG = "--metrics-config"
# The number at the start of a string, as C's strtod (Triton's std::stod) reads it.
_LEADING_NUMBER = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricsConfig:
    """``--metrics-config <setting>=<value>`` (Triton's settings, and ``histogram_buckets`` of ours)."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    histogram_latencies: bool = False
    histogram_buckets: tuple[float, ...] = DEFAULT_BUCKETS_US
    first_response_buckets: tuple[float, ...] = DEFAULT_FIRST_RESPONSE_BUCKETS_MS
    unknown: list[str] = field(default_factory=list)  # settings Triton would ignore too (we warn)

    def latency_settings(self) -> LatencySettings | None:
        if not (self.summary_latencies or self.histogram_latencies):
            return None
        return LatencySettings(summaries=self.summary_latencies, histograms=self.histogram_latencies,
                               buckets_us=self.histogram_buckets,
                               first_response_buckets_ms=self.first_response_buckets)


def parse_metrics_config(items: list[str]) -> MetricsConfig:
    """Each ``<setting>=<value>``, later ones winning; a malformed one raises ServerError naming the flag."""
    values: dict[str, object] = {}
    unknown = []
    for item in items:
        setting, sep, value = item.partition("=")
        if not sep or "," in setting or not setting or not value:
            raise ServerError(f"{FLAG} option format is <setting>=<value>. Got {item}")
        if setting in ("counter_latencies", "summary_latencies", "histogram_latencies"):
            values[setting] = _boolean(setting, value)
        elif setting == "summary_quantiles":
            quantiles = _quantiles(value)
            if quantiles:  # as Triton: none valid keeps the quantiles in force
                values[setting] = quantiles
        elif setting in ("histogram_buckets", "first_response_buckets"):
            values[setting] = _buckets(setting, value)
        else:
            unknown.append(setting)
    return MetricsConfig(**values, unknown=unknown)  # type: ignore[arg-type]


def _boolean(setting: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "on", "yes"):
        return True
    if lowered in ("false", "0", "off", "no"):
        return False
    raise ServerError(f"{FLAG} {setting}={value}: expected true or false")


def _quantiles(value: str) -> tuple[tuple[float, float], ...]:
    """Triton's ``ParseQuantiles``: comma-separated ``<quantile>:<error>`` pairs, each number read as
    ``std::stod`` reads it (its leading number: ``0.0.1`` is 0.0); a pair without ``:`` or a number is
    logged and skipped, not a start-up error."""
    pairs = []
    parts = value.split(",")
    if parts[-1] == "":
        parts.pop()  # a trailing comma ends the list, as std::getline reads it
    for part in parts:
        quantile, sep, error = part.partition(":")
        if not sep:
            log.error("Invalid option: [%s]. No ':' delimiter found. Expected format is <quantile>:<error>", part)
            continue
        numbers = [_LEADING_NUMBER.match(text) for text in (quantile, error)]
        if numbers[0] is None or numbers[1] is None:
            log.error("Invalid option: [%s]. Error: stod", part)
            continue
        pair = (float(numbers[0].group()), float(numbers[1].group()))
        if not all(math.isfinite(number) for number in pair):  # std::stod throws out_of_range
            log.error("Invalid option: [%s]. Error: stod", part)
            continue
        pairs.append(pair)
    return tuple(pairs)


def _buckets(setting: str, value: str) -> tuple[float, ...]:
    try:
        bounds = tuple(float(part) for part in value.split(","))
    except ValueError:
        bounds = ()
    if not bounds or any(math.isnan(b) or math.isinf(b) for b in bounds) or list(bounds) != sorted(set(bounds)):
        raise ServerError(f"{FLAG} {setting}={value}: expected finite upper bounds in increasing order, "
                          f"separated by commas")
    return bounds


def _us(ns: int) -> int:
    return ns // 1000


# (family, help, ModelStats attribute of a Duration, field) in Triton's order.
_COUNTERS = (
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)", "success"),
    ("nv_inference_queue_duration_us",
     "Cumulative inference queuing duration in microseconds (includes cached requests)", "queue"),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)", "compute_input"),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)", "compute_infer"),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     "compute_output"),
)
_CACHE_COUNTERS = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", False),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds", "cache_hit", True),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", False),
    ("nv_cache_miss_duration_per_model",
     "Total cache miss (insert+lookup) duration per model, in microseconds", "cache_miss", True),
)
_SUMMARIES = (
    ("nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)", "request"),
    ("nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)", "queue"),
    ("nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)", "compute_input"),
    ("nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)", "compute_infer"),
    ("nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     "compute_output"),
)
_CACHE_SUMMARIES = (
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds.",
     "cache_hit"),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds.",
     "cache_miss"),
)
# Beyond Triton: latency histograms for every model (histogram_latencies=true).
_HISTOGRAMS = (
    ("nv_inference_request_histogram_us",
     "Histogram of successful inference request durations (end to end) in microseconds", "request"),
    ("nv_inference_queue_histogram_us", "Histogram of inference queuing durations in microseconds", "queue"),
    ("nv_inference_compute_histogram_us",
     "Histogram of inference compute durations (input + infer + output) in microseconds", "compute"),
)
_Version = tuple[dict[str, str], ModelStats, bool]  # labels, statistics, whether the response cache serves it
FIRST_RESPONSE_HISTOGRAM = ("nv_inference_first_response_histogram_ms",
                            "Duration from request to first response in milliseconds")


class TritonCollector(Collector):
    """Every metric family, read from the repository's ModelStats (and the system sampler) per scrape.

    Called from prometheus_client's exposition on the owner's event loop, so it reads the counters
    between requests: requests take no lock and do no metrics work of their own.
    """

    def __init__(self, repository: ModelRepository, config: MetricsConfig, cache_enabled: bool,
                 system: SystemSampler | None = None) -> None:
        self.repository = repository
        self.config = config
        self.cache_enabled = cache_enabled
        self.system = system

    def _versions(self) -> list[_Version]:
        """(labels, stats, cached) of every ready version."""
        found = []
        for name in sorted(self.repository.models):
            model = self.repository.models[name]
            for version in sorted(model.versions.values(), key=lambda v: v.version):
                if version.is_ready():
                    labels = {"model": model.name, "version": str(version.version)}
                    route = version.route
                    found.append((labels, version.stats, self.cache_enabled and route.cacheable))
        return found

    def collect(self) -> Iterator[Metric]:
        versions = self._versions()
        yield from self._counters(versions)
        pending = Metric("nv_inference_pending_request_count",
                         "Instantaneous number of pending requests awaiting execution per-model.", "gauge")
        load = Metric("nv_model_load_duration_secs", "Model load time in seconds", "gauge")
        for labels, stats, _ in versions:
            pending.add_sample(pending.name, labels, stats.pending)
            load.add_sample(load.name, labels, stats.load_seconds)
        yield pending
        yield load
        if self.system is not None:
            yield from self.system.collect()
        if self.config.summary_latencies:
            yield from self._summaries(versions)
        if self.config.histogram_latencies:
            yield from self._histograms(versions)

    def _counters(self, versions: list[_Version]) -> Iterator[Metric]:
        success = Metric("nv_inference_request_success",
                         "Number of successful inference requests, all batch sizes", "counter")
        failure = Metric("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
                         "counter")
        count = Metric("nv_inference_count", "Number of inferences performed (does not include cached requests)",
                       "counter")
        executions = Metric("nv_inference_exec_count",
                            "Number of model executions performed (does not include cached requests)", "counter")
        for labels, stats, _ in versions:
            success.add_sample(success.name, labels, stats.success.count)
            for reason in FAILURE_REASONS:
                failure.add_sample(failure.name, {"model": labels["model"], "reason": reason,
                                                  "version": labels["version"]}, stats.failures[reason])
            count.add_sample(count.name, labels, stats.inference_count)
            executions.add_sample(executions.name, labels, stats.execution_count)
        yield from (success, failure, count, executions)
        if not self.config.counter_latencies:
            return
        for name, help_text, attribute in _COUNTERS:
            metric = Metric(name, help_text, "counter")
            for labels, stats, _ in versions:
                metric.add_sample(name, labels, _us(getattr(stats, attribute).ns))
            yield metric
        if any(cached for *_, cached in versions):
            for name, help_text, attribute, duration in _CACHE_COUNTERS:
                metric = Metric(name, help_text, "counter")
                for labels, stats, cached in versions:
                    if not cached:
                        continue
                    total = getattr(stats, attribute)
                    metric.add_sample(name, labels, _us(total.ns) if duration else total.count)
                yield metric

    def _summaries(self, versions: list[_Version]) -> Iterator[Metric]:
        wanted = [quantile for quantile, _error in self.config.summary_quantiles]
        now = time.monotonic_ns()
        for name, help_text, kind in _SUMMARIES + _CACHE_SUMMARIES:
            metric = Metric(name, help_text, "summary")
            for labels, stats, cached in versions:
                if stats.latency is None or stats.latency.summaries is None:
                    continue
                # As Triton: cache summaries only where the cache is on, and there no request summary.
                if (kind == "request" and cached) or (kind.startswith("cache") and not cached):
                    continue
                window = stats.latency.summaries[kind]
                metric.add_sample(f"{name}_count", labels, window.count)
                metric.add_sample(f"{name}_sum", labels, window.sum)
                for quantile, value in zip(wanted, window.quantiles(wanted, now)):
                    metric.add_sample(name, {**labels, "quantile": _number(quantile)}, value)
            if metric.samples:  # a family without samples is not written, as prometheus-cpp does
                yield metric

    def _histograms(self, versions: list[_Version]) -> Iterator[Metric]:
        name, help_text = FIRST_RESPONSE_HISTOGRAM
        yield self._histogram(name, help_text, "first_response",
                              [(labels, stats) for labels, stats, _ in versions])
        for name, help_text, kind in _HISTOGRAMS:
            yield self._histogram(name, help_text, kind, [(labels, stats) for labels, stats, _ in versions])

    @staticmethod
    def _histogram(name: str, help_text: str, kind: str, versions: list[tuple[dict[str, str], ModelStats]]) -> Metric:
        metric = Metric(name, help_text, "histogram")
        for labels, stats in versions:
            if stats.latency is None or stats.latency.histograms is None:
                continue
            histogram = stats.latency.histograms[kind]
            counts = list(histogram.counts)  # one consistent read
            metric.add_sample(f"{name}_count", labels, sum(counts))  # prometheus-cpp's order: count, sum, buckets
            metric.add_sample(f"{name}_sum", labels, histogram.sum)
            cumulative = 0
            for bound, bucket in zip((*histogram.bounds, math.inf), counts):
                cumulative += bucket
                metric.add_sample(f"{name}_bucket", {**labels, "le": _number(bound)}, cumulative)
        return metric


def _number(value: float) -> str:
    """A number as Triton's prometheus-cpp writes it: 3, 0.25, +Inf, NaN."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(text: str, quote: bool) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quote else text


def render(registry: Collector) -> bytes:
    """The text exposition format (0.0.4) as Triton writes it: family names as given (no ``_total``
    added to counters, unlike ``prometheus_client.generate_latest``), labels in Triton's order
    (model, version, then quantile or le), integral values without a fraction."""
    lines = []
    for metric in registry.collect():
        lines.append(f"# HELP {metric.name} {_escape(metric.documentation, False)}")
        lines.append(f"# TYPE {metric.name} {metric.type}")
        for sample in metric.samples:
            labels = ",".join(f'{key}="{_escape(str(label), True)}"' for key, label in sample.labels.items())
            lines.append(f"{sample.name}{{{labels}}} {_number(sample.value)}" if labels
                         else f"{sample.name} {_number(sample.value)}")
    return ("\n".join(lines) + "\n").encode() if lines else b""
