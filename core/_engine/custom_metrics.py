"""Custom metric families that plugins create while serving (Triton's TRITONSERVER_MetricFamily API)."""
from __future__ import annotations

import math
import re
import threading
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from .errors import ServerError, Status
from .metrics import _number

# The kinds, in the order prometheus-cpp's registry (Triton's) exports its families.
METRIC_KINDS = ("counter", "gauge", "histogram")
# What each kind can do, named as Triton's errors name it.
_OPERATIONS = {"counter": ("Increment", "Value"), "gauge": ("Increment", "Set", "Value"), "histogram": ("Observe",)}
_NEGATIVE_COUNTER = ("TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative "
                     "values.")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
LabelKey = tuple[tuple[str, str], ...]


def _valid_name(name: str, pattern: re.Pattern[str]) -> bool:
    return not name.startswith("__") and pattern.fullmatch(name) is not None


class CustomMetric:
    """One labelled metric of a family. Everyone who asks the family for the same labels shares it; it leaves
    the export when the last of them releases it. Thread-safe."""

    def __init__(self, family: CustomMetricFamily, key: LabelKey, buckets: tuple[float, ...]) -> None:
        self.family = family
        self.labels = dict(key)
        self._key = key
        self._value = 0.0
        self._bounds = buckets
        self._counts = [0] * (len(buckets) + 1)
        self._references = 0

    def _check(self, operation: str) -> None:
        kind = self.family.kind
        if operation not in _OPERATIONS[kind]:
            raise ServerError(f"TRITONSERVER_METRIC_KIND_{kind.upper()} does not support {operation}",
                              Status.UNSUPPORTED)

    def increment(self, value: float) -> None:
        """Add ``value`` (a counter takes only non-negative values)."""
        self._check("Increment")
        if self.family.kind == "counter" and value < 0.0:
            raise ServerError(_NEGATIVE_COUNTER, Status.INVALID_ARG)
        with self.family.lock:
            self._value += value

    def set(self, value: float) -> None:
        """Set a gauge to ``value``."""
        self._check("Set")
        with self.family.lock:
            self._value = value

    def observe(self, value: float) -> None:
        """Count ``value`` into a histogram's bucket and sum."""
        self._check("Observe")
        with self.family.lock:
            self._value += value
            self._counts[bisect_left(self._bounds, value)] += 1

    def value(self) -> float:
        """A counter's or gauge's current value."""
        self._check("Value")
        return self._value

    def release(self) -> None:
        """Drop one reference taken by ``CustomMetricFamily.metric``; the last one removes the metric."""
        self.family._release(self)

    def _add_samples(self, metric: Metric) -> None:
        name = self.family.name
        if self.family.kind != "histogram":
            metric.add_sample(name, self.labels, self._value)
            return
        counts = list(self._counts)
        metric.add_sample(f"{name}_count", self.labels, sum(counts))  # prometheus-cpp's order: count, sum, buckets
        metric.add_sample(f"{name}_sum", self.labels, self._value)
        cumulative = 0
        for bound, count in zip((*self._bounds, math.inf), counts):
            cumulative += count
            metric.add_sample(f"{name}_bucket", {**self.labels, "le": _number(bound)}, cumulative)


class CustomMetricFamily:
    """A named family of one kind; its metrics differ by their labels. Families stay registered for the
    process's life (as in Triton), and one without metrics is not exported."""

    def __init__(self, name: str, description: str, kind: str, lock: threading.Lock) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.lock = lock
        self._metrics: dict[LabelKey, CustomMetric] = {}

    def metric(self, labels: Mapping[str, str] | None = None,
               buckets: Sequence[float] | None = None) -> CustomMetric:
        """The metric with ``labels`` (created at 0 on first use), with one more reference to release.
        A histogram needs its bucket upper bounds, strictly increasing; an existing one keeps its own."""
        if self.kind == "histogram":
            if buckets is None:
                raise ServerError("Bucket boundaries not found in Metric args.")
            bounds = tuple(float(bound) for bound in buckets)
            if any(low >= high for low, high in zip(bounds, bounds[1:])):
                raise ServerError("Bucket Boundaries must be strictly sorted")
        elif buckets is not None:
            raise ServerError(f"Unexpected args found in {self.kind} Metric constructor.")
        else:
            bounds = ()
        labels = dict(labels or {})
        for name, value in labels.items():
            if not isinstance(value, str):
                raise ServerError(f"the value of label '{name}' must be a string, got {type(value).__name__}")
            if not isinstance(name, str) or not _valid_name(name, _LABEL_NAME) or \
                    (self.kind == "histogram" and name == "le"):
                raise ServerError("Invalid label name")
        key = tuple(sorted(labels.items()))
        with self.lock:
            metric = self._metrics.get(key)
            if metric is None:
                metric = self._metrics[key] = CustomMetric(self, key, bounds)
            metric._references += 1
        return metric

    def _release(self, metric: CustomMetric) -> None:
        with self.lock:
            metric._references -= 1
            if metric._references <= 0 and self._metrics.get(metric._key) is metric:
                del self._metrics[metric._key]

    def _collect(self) -> Metric | None:
        with self.lock:
            metrics = list(self._metrics.values())
            if not metrics:
                return None
            exported = Metric(self.name, self.description, self.kind)
            for metric in metrics:
                metric._add_samples(exported)
        return exported


class CustomMetricRegistry(Collector):
    """The custom metric families, which ``/metrics`` exports after Triton's own, exactly as created: no
    ``model`` or ``version`` labels are added. One registry serves the whole process (``custom_metrics``),
    as Triton's does; every method is thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, CustomMetricFamily] = {}

    def family(self, name: str, description: str, kind: str) -> CustomMetricFamily:
        """The family called ``name``, registered now if new. Asking again with the same kind returns the same
        family, whose first description stays; another kind raises ServerError, as Triton."""
        if kind not in METRIC_KINDS:
            raise ServerError(f"Unsupported kind '{kind}' passed to MetricFamily constructor; expected one of "
                              f"{', '.join(METRIC_KINDS)}.")
        if not _valid_name(name, _METRIC_NAME):
            raise ServerError("Invalid metric name")
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = CustomMetricFamily(name, description, kind, self._lock)
        if family.kind != kind:
            raise ServerError("Family name already exists with different type")
        return family

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = sorted(self._families.values(), key=lambda family: METRIC_KINDS.index(family.kind))
        for family in families:
            exported = family._collect()
            if exported is not None:
                yield exported


custom_metrics = CustomMetricRegistry()
