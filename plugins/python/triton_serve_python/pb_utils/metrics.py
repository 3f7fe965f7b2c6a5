"""pb_utils.MetricFamily and Metric: custom metrics that the server exports on its /metrics endpoint."""
from __future__ import annotations

import contextlib
import enum
import json
import numbers
from typing import Any

from .errors import TritonError, TritonModelException
from .server_link import ServerLink, server_link


class MetricKind(enum.IntEnum):
    """A family's kind: MetricFamily.COUNTER, MetricFamily.GAUGE or MetricFamily.HISTOGRAM."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


# What each kind supports, as Triton's core says it (TRITONSERVER_METRIC_KIND_<KIND> does not support <Op>).
_OPERATIONS = {MetricKind.COUNTER: ("Increment", "Value"), MetricKind.GAUGE: ("Increment", "Set", "Value"),
               MetricKind.HISTOGRAM: ("Observe",)}
_DELETED_FAMILY = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
                   "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been "
                   "deleted.")
_NEGATIVE_COUNTER = ("TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative "
                     "values.")


def _call(what: str, method: str, *args: Any) -> Any:
    try:
        return server_link("pb_utils.MetricFamily").call(method, *args)
    except TritonError as error:
        raise TritonModelException(f"{what}: {error.message()}", error.code()) from None


class MetricFamily:
    """A family of metrics of one kind, exported under ``name`` with ``description`` as its help text.

    Every model and instance that creates a family of the same name and kind gets the same family (the first
    description stays); another kind raises TritonModelException. Deleting the family deletes the metrics
    made through it, and using those afterwards raises. Unloading the model deletes what it created.
    """

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self._metrics: dict[tuple[tuple[str, str], ...], Metric] = {}  # the first Metric made per label set
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily name and description must be strings")
        try:
            self._kind = MetricKind(kind)
        except ValueError:
            raise TypeError(f"MetricFamily kind must be pb_utils.MetricFamily.COUNTER, GAUGE or HISTOGRAM, "
                            f"got {kind!r}") from None
        self._name, self._description = name, description
        _call("Error when creating MetricFamily", "metric_family_new", name, description, self._kind_name)

    @property
    def _kind_name(self) -> str:
        return self._kind.name.lower()

    def Metric(self, labels: dict[str, str] | None = None,  # noqa: N802 (Triton's name)
               buckets: list[float] | None = None) -> Metric:
        """The metric with ``labels`` (string values), starting at 0; a histogram needs ``buckets``, its
        strictly increasing upper bounds. The same family and labels anywhere in the server are one metric."""
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self._kind != MetricKind.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            buckets = [_number("a bucket bound", bound) for bound in buckets]
        elif self._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        label_values = json.loads(json.dumps(labels or {}))  # keys become strings, as Triton's JSON round trip
        handle = _call("Error when creating Metric", "metric_new", self._name, self._description, self._kind_name,
                       label_values, buckets)
        metric = Metric(self._kind, handle)
        self._metrics.setdefault(tuple(sorted(label_values.items())), metric)
        return metric

    def __del__(self) -> None:
        for metric in self._metrics.values():
            metric._delete()


def _number(what: str, value: Any) -> float:
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    return float(value)


class Metric:
    """One metric of a MetricFamily, made by ``MetricFamily.Metric``. Updates go to the server without
    waiting; ``value()`` asks it, so it includes every instance's updates.

    As in Triton, the family keeps the first Metric made for each label set (deleting the family deletes
    those); another one for the same labels lives as long as the model holds it.
    """

    def __init__(self, kind: MetricKind, handle: int) -> None:
        self._kind = kind
        self._handle = handle
        self._deleted = False

    def increment(self, value: float) -> None:
        """Add ``value``: a counter takes only non-negative values; a histogram cannot."""
        what = "Failed to increment metric value"
        value = _number("value", value)
        link = self._checked(what, "Increment")
        if self._kind == MetricKind.COUNTER and value < 0.0:
            raise TritonModelException(f"{what}: {link.failure(_NEGATIVE_COUNTER)}", TritonError.INVALID_ARG)
        link.notify("metric_increment", self._handle, value)

    def set(self, value: float) -> None:
        """Set a gauge to ``value``."""
        value = _number("value", value)
        self._checked("Failed to set metric value", "Set").notify("metric_set", self._handle, value)

    def observe(self, value: float) -> None:
        """Count ``value`` into a histogram."""
        value = _number("value", value)
        self._checked("Failed to observe metric value", "Observe").notify("metric_observe", self._handle, value)

    def value(self) -> float:
        """A counter's or gauge's value now, as the server holds it."""
        what = "Failed to get metric value"
        self._checked(what, "Value")
        return _call(what, "metric_value", self._handle)

    def _checked(self, what: str, operation: str) -> ServerLink:
        """The server link, once the operation is known to succeed (updates have no answer to fail with)."""
        if self._deleted:
            raise TritonModelException(f"{what}: {_DELETED_FAMILY}")
        link = server_link("pb_utils.Metric")
        if operation not in _OPERATIONS[self._kind]:
            detail = f"TRITONSERVER_METRIC_KIND_{self._kind.name} does not support {operation}"
            raise TritonModelException(f"{what}: {link.failure(detail)}", TritonError.UNSUPPORTED)
        return link

    def _delete(self) -> None:
        if self._deleted:
            return
        self._deleted = True
        with contextlib.suppress(Exception):  # a worker that is exiting: the server releases its metrics anyway
            server_link("pb_utils.Metric").notify_soon("metric_delete", self._handle)

    def __del__(self) -> None:
        self._delete()
