"""The calls behind pb_utils.MetricFamily and Metric: one worker's metrics in the core's custom metric registry."""
from __future__ import annotations

import itertools
from collections.abc import Sequence

from triton_serve.plugin import CustomMetric, ServerError, custom_metrics

from .server_calls import Handler


class WorkerMetrics:
    """The metrics one worker holds, each under the handle its ``pb_utils.Metric`` was given.

    Every handle is one reference to a shared metric (other workers and models asking for the same family
    and labels share it); ``release_all`` drops what the worker still holds once it exits, so a model's
    metrics leave ``/metrics`` when it unloads, crashes or restarts.
    """

    def __init__(self) -> None:
        self._metrics: dict[int, CustomMetric] = {}
        self._handles = itertools.count(1)

    def handlers(self) -> dict[str, Handler]:
        """The calls, by the names the worker uses."""
        return {"metric_family_new": self.family_new, "metric_new": self.metric_new,
                "metric_increment": self.increment, "metric_set": self.set, "metric_observe": self.observe,
                "metric_value": self.value, "metric_delete": self.delete}

    def family_new(self, name: str, description: str, kind: str) -> None:
        custom_metrics.family(name, description, kind)

    def metric_new(self, name: str, description: str, kind: str, labels: dict[str, str],
                   buckets: Sequence[float] | None) -> int:
        metric = custom_metrics.family(name, description, kind).metric(labels, buckets)
        handle = next(self._handles)
        self._metrics[handle] = metric
        return handle

    def increment(self, handle: int, value: float) -> None:
        self._metric(handle).increment(value)

    def set(self, handle: int, value: float) -> None:
        self._metric(handle).set(value)

    def observe(self, handle: int, value: float) -> None:
        self._metric(handle).observe(value)

    def value(self, handle: int) -> float:
        return self._metric(handle).value()

    def delete(self, handle: int) -> None:
        self._metric(handle).release()
        del self._metrics[handle]

    def release_all(self) -> None:
        for metric in self._metrics.values():
            metric.release()
        self._metrics.clear()

    def _metric(self, handle: int) -> CustomMetric:
        metric = self._metrics.get(handle)
        if metric is None:
            raise ServerError(f"the worker holds no metric with handle {handle}")
        return metric
