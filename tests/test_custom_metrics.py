"""Custom metric families that plugins create (``triton_serve.plugin.custom_metrics``), as /metrics serves them."""
from __future__ import annotations

import httpx
import pytest

from triton_serve._engine.custom_metrics import CustomMetricRegistry
from triton_serve._engine.errors import ServerError, Status
from triton_serve._engine.metrics import render
from triton_serve.plugin import custom_metrics


def test_families_and_metrics_follow_tritons_rules() -> None:
    registry = CustomMetricRegistry()
    latency = registry.family("tsc_latency", "Latency", "histogram")
    assert registry.family("tsc_latency", "Another description", "histogram") is latency
    with pytest.raises(ServerError, match="^Family name already exists with different type$"):
        registry.family("tsc_latency", "Latency", "gauge")
    for name in ("", "1st", "__reserved", "with-dash"):
        with pytest.raises(ServerError, match="^Invalid metric name$"):
            registry.family(name, "d", "counter")
    with pytest.raises(ServerError, match="^Bucket boundaries not found in Metric args.$"):
        latency.metric({})
    with pytest.raises(ServerError, match="^Bucket Boundaries must be strictly sorted$"):
        latency.metric({}, [1, 1])
    for labels in ({"1a": "x"}, {"__a": "x"}, {"le": "x"}):
        with pytest.raises(ServerError, match="^Invalid label name$"):
            latency.metric(labels, [1])
    with pytest.raises(ServerError, match="the value of label 'a' must be a string, got int"):
        latency.metric({"a": 1}, [1])  # type: ignore[dict-item]
    observed = latency.metric({"b": "2", "a": "1"}, [1, 2.5])
    for value in (0.5, 1, 3):
        observed.observe(value)
    events = registry.family("tsc_events", "Events", "counter")
    with pytest.raises(ServerError, match="^Unexpected args found in counter Metric constructor.$"):
        events.metric({}, [1])
    counted = events.metric()
    counted.increment(2)
    assert render(registry).decode().splitlines() == [  # counters before histograms, labels sorted, le last
        "# HELP tsc_events Events", "# TYPE tsc_events counter", "tsc_events 2",
        "# HELP tsc_latency Latency", "# TYPE tsc_latency histogram",
        'tsc_latency_count{a="1",b="2"} 3', 'tsc_latency_sum{a="1",b="2"} 4.5',
        'tsc_latency_bucket{a="1",b="2",le="1"} 2', 'tsc_latency_bucket{a="1",b="2",le="2.5"} 2',
        'tsc_latency_bucket{a="1",b="2",le="+Inf"} 3']
    observed.release()
    counted.release()
    assert render(registry) == b""  # families without metrics are not exported


@pytest.mark.parametrize("kind, operation, status, message", [
    ("counter", lambda m: m.increment(-1), Status.INVALID_ARG,
     "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."),
    ("counter", lambda m: m.set(1), Status.UNSUPPORTED, "TRITONSERVER_METRIC_KIND_COUNTER does not support Set"),
    ("gauge", lambda m: m.observe(1), Status.UNSUPPORTED, "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"),
    ("histogram", lambda m: m.value(), Status.UNSUPPORTED,
     "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"),
])
def test_operations_a_kind_lacks_raise(kind, operation, status, message) -> None:  # type: ignore[no-untyped-def]
    metric = CustomMetricRegistry().family("tsc_kind", "d", kind).metric({}, [1] if kind == "histogram" else None)
    with pytest.raises(ServerError) as raised:
        operation(metric)
    assert (raised.value.status, raised.value.message) == (status, message)


def test_a_plugins_metric_is_served_until_every_holder_releases_it(toy_server) -> None:  # type: ignore[no-untyped-def]
    server = toy_server()
    family = custom_metrics.family("tsc_plugin_events", "Events a plugin saw", "gauge")
    first, second = family.metric({"source": "test"}), family.metric({"source": "test"})
    first.increment(2)
    second.increment(-0.5)
    lines = httpx.get(server.metrics_url, timeout=10).text.splitlines()
    start = lines.index("# HELP tsc_plugin_events Events a plugin saw")
    assert lines[start:start + 3] == ["# HELP tsc_plugin_events Events a plugin saw",
                                      "# TYPE tsc_plugin_events gauge", 'tsc_plugin_events{source="test"} 1.5']
    assert start > lines.index("# TYPE nv_cpu_utilization gauge")  # after Triton's own families
    first.release()
    assert second.value() == 1.5
    second.release()
    assert "tsc_plugin_events" not in httpx.get(server.metrics_url, timeout=10).text
