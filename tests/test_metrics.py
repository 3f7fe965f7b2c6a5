"""Prometheus metrics on the metrics port, with Triton's names, help texts, types and labels, scraped
over HTTP after inferences through tritonclient HTTP and gRPC."""
from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve._engine.cli import build_parser, main, options_from_args
from triton_serve._engine.errors import ServerError
from triton_serve._engine.metrics import DEFAULT_BUCKETS_US, DEFAULT_QUANTILES, parse_metrics_config
from triton_serve._engine.system_metrics import _GPU
from triton_serve.plugin import visible_gpu_ids

from .conftest import ADD_SUB, FRONTEND_MODES
from .test_grpc import FAILING, REPEAT

COUNTER = """
backend: "toy_count"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }
output { name: "OUTPUT0" data_type: TYPE_INT64 dims: [ 1 ] }
response_cache { enable: true }
"""
DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "triton-serve-dashboard.json"
LABELS = '{model="add_sub",version="1"}'
# Triton 2.51's per-model families: (name, type, help), as its /metrics writes them.
TRITON_FAMILIES = [
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)"),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)"),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)"),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
    ("nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model."),
    ("nv_model_load_duration_secs", "gauge", "Model load time in seconds"),
    ("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]"),
    ("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes"),
    ("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes"),
]
SUMMARIES = ["nv_inference_request_summary_us", "nv_inference_queue_summary_us",
             "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
             "nv_inference_compute_output_summary_us"]
HISTOGRAMS = ["nv_inference_request_histogram_us", "nv_inference_queue_histogram_us",
              "nv_inference_compute_histogram_us"]


def scrape(server) -> str:  # type: ignore[no-untyped-def]
    response = httpx.get(server.metrics_url, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample line as {(name, sorted labels): value} (prometheus_client's own parser renames counter
    samples to ``<name>_total``, which neither Triton nor we write)."""
    found = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        assert match, line
        labels = tuple(sorted(re.findall(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"', match.group(2) or "")))
        found[(match.group(1), labels)] = float(match.group(3))
    return found


def value(text: str, name: str, model: str = "add_sub", **labels: str) -> float:
    key = tuple(sorted({"model": model, "version": "1", **labels}.items()))
    return samples(text)[(name, key)]


def families(text: str) -> dict[str, str]:
    """{family name: type} from the # TYPE lines."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))


def add_sub_inputs(module, count: int = 1):  # type: ignore[no-untyped-def]
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [count, 16], "INT32")
        tensor.set_data_from_numpy(np.ones((count, 16), dtype=np.int32))
        tensors.append(tensor)
    return tensors


def infer_add_sub(server, http: int = 3, grpc: int = 2) -> None:  # type: ignore[no-untyped-def]
    client = httpclient.InferenceServerClient(server.http_url)
    for _ in range(http):
        client.infer("add_sub", add_sub_inputs(httpclient))
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
        for _ in range(grpc):
            grpc_client.infer("add_sub", add_sub_inputs(grpcclient))


@pytest.fixture
def server(add_model, toy_server):  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("failing", FAILING)
    return toy_server()


@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES, ids=lambda count: f"frontend_processes={count}")
def test_triton_families_names_help_types_and_values(server) -> None:  # type: ignore[no-untyped-def]
    infer_add_sub(server, http=3, grpc=2)
    client = httpclient.InferenceServerClient(server.http_url)
    client.infer("add_sub", add_sub_inputs(httpclient, count=4))  # a batch of 4: one request, 4 inferences
    with pytest.raises(InferenceServerException):
        client.infer("add_sub", add_sub_inputs(httpclient)[:1])  # missing input: failed, reason OTHER
    with pytest.raises(InferenceServerException):
        tensor = httpclient.InferInput("INPUT0", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
        client.infer("failing", [tensor])  # the backend fails: reason BACKEND
    text = scrape(server)
    for name, kind, help_text in TRITON_FAMILIES:
        assert f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n" in text, name
    for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count",
                 "nv_inference_pending_request_count"):
        assert re.search(rf"^{name}{re.escape(LABELS)} ", text, re.MULTILINE), name  # Triton's label text
    assert value(text, "nv_inference_request_success") == 6
    assert value(text, "nv_inference_count") == 9
    assert value(text, "nv_inference_exec_count") == 6
    assert {reason: value(text, "nv_inference_request_failure", reason=reason)
            for reason in ("OTHER", "BACKEND", "CANCELED", "REJECTED")} == {
        "OTHER": 1, "BACKEND": 0, "CANCELED": 0, "REJECTED": 0}
    assert value(text, "nv_inference_request_failure", "failing", reason="BACKEND") == 1
    assert value(text, "nv_inference_request_success", "failing") == 0
    assert value(text, "nv_inference_pending_request_count") == 0
    assert value(text, "nv_model_load_duration_secs") >= 0
    for name in ("nv_inference_request_duration_us", "nv_inference_compute_infer_duration_us"):
        assert value(text, name) > 0
    assert not re.search(r"_summary_us|_histogram_", text)  # off by default, as in Triton
    if not visible_gpu_ids():
        assert "nv_gpu_" not in text  # no GPU, no GPU metrics


@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES, ids=lambda count: f"frontend_processes={count}")
def test_duration_counters_increase(server) -> None:  # type: ignore[no-untyped-def]
    infer_add_sub(server, http=1, grpc=1)
    before = scrape(server)
    infer_add_sub(server, http=1, grpc=1)
    after = scrape(server)
    for name in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_infer_duration_us"):
        assert value(after, name) > value(before, name), name
    assert value(after, "nv_inference_request_success") == value(before, "nv_inference_request_success") + 2


def test_model_statistics_and_metrics_agree(server) -> None:  # type: ignore[no-untyped-def]
    infer_add_sub(server, http=2, grpc=2)
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics("add_sub")["model_stats"][0]
    text = scrape(server)
    assert value(text, "nv_inference_request_success") == stats["inference_stats"]["success"]["count"]
    assert value(text, "nv_inference_request_duration_us") == stats["inference_stats"]["success"]["ns"] // 1000
    assert value(text, "nv_inference_exec_count") == stats["execution_count"]


def test_allow_metrics_false_serves_nothing(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    server = toy_server(allow_metrics=False)
    infer_add_sub(server, http=1, grpc=0)
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.metrics_url, timeout=5)


def test_cpu_metrics_can_be_turned_off(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    on = scrape(toy_server())
    assert samples(on)[("nv_cpu_memory_total_bytes", ())] > samples(on)[("nv_cpu_memory_used_bytes", ())] > 0
    off = scrape(toy_server(allow_cpu_metrics=False))
    assert "nv_cpu_" not in off and "nv_inference_count" in off


def test_other_paths_are_not_found(server) -> None:  # type: ignore[no-untyped-def]
    assert httpx.get(server.metrics_url.replace("/metrics", "/v2/health/ready"), timeout=5).status_code == 404


def test_counter_latencies_false_keeps_only_the_counts(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    server = toy_server(metrics_config=parse_metrics_config(["counter_latencies=false"]))
    infer_add_sub(server, http=1, grpc=0)
    kinds = families(scrape(server))
    assert "nv_inference_request_success" in kinds and "nv_inference_count" in kinds
    assert not [name for name in kinds if name.endswith("_duration_us")]


def test_summaries_with_quantiles(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    config = parse_metrics_config(["summary_latencies=true", "summary_quantiles=0.5:0.05,0.99:0.001"])
    server = toy_server(metrics_config=config)
    infer_add_sub(server, http=2, grpc=1)
    text = scrape(server)
    kinds = families(text)
    assert "# HELP nv_inference_request_summary_us Summary of inference request duration in microseconds " \
           "(includes cached requests)\n" in text
    for name in SUMMARIES:
        assert kinds[name] == "summary"
        assert value(text, f"{name}_count") == 3
        assert {q for (sample, labels) in samples(text) if sample == name
                for key, q in labels if key == "quantile"} == {"0.5", "0.99"}
    assert re.search(r'^nv_inference_queue_summary_us\{model="add_sub",version="1",quantile="0.5"\} ', text,
                     re.MULTILINE)
    assert value(text, "nv_inference_request_summary_us_sum") == pytest.approx(
        value(text, "nv_inference_request_duration_us"), abs=3)
    assert not [name for name in kinds if "histogram" in name]


def test_histograms_for_every_model_with_custom_buckets(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("repeat", REPEAT)
    config = parse_metrics_config(["histogram_latencies=true", "histogram_buckets=10,1000,1e9"])
    server = toy_server(metrics_config=config)
    infer_add_sub(server, http=2, grpc=2)
    text = scrape(server)
    kinds = families(text)
    for name in HISTOGRAMS:
        assert kinds[name] == "histogram"
        buckets = {dict(labels)["le"]: count for (sample, labels), count in samples(text).items()
                   if sample == f"{name}_bucket" and dict(labels)["model"] == "add_sub"}
        assert set(buckets) == {"10", "1000", "1000000000", "+Inf"}
        assert buckets["1000000000"] == buckets["+Inf"] == value(text, f"{name}_count") == 4
        assert buckets["10"] <= buckets["1000"] <= 4
    assert value(text, "nv_inference_request_histogram_us_sum") == pytest.approx(
        value(text, "nv_inference_request_duration_us"), abs=3)
    assert kinds["nv_inference_first_response_histogram_ms"] == "histogram"
    # Every model's first response since Triton 2.65 (decoupled models only before).
    assert value(text, "nv_inference_first_response_histogram_ms_count") == 4


def test_model_metrics_in_the_config_sets_that_models_first_response_buckets(  # type: ignore[no-untyped-def]
        add_model, toy_server, caplog: pytest.LogCaptureFixture) -> None:
    add_model("add_sub", ADD_SUB + """model_metrics { metric_control [
        { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
          histogram_options { buckets: [ 1, 2, 4, 8 ] } },
        { metric_identifier { family: "nv_inference_request_histogram_us" } histogram_options { buckets: [ 5 ] } }
    ] }""")  # Triton 2.52; only the first-response family is customizable
    add_model("plain", ADD_SUB)
    with caplog.at_level(logging.WARNING, logger="triton_serve"):
        server = toy_server(metrics_config=parse_metrics_config(["histogram_latencies=true"]))
    assert "Metric family 'nv_inference_request_histogram_us' in 'metric_identifier' is not a customizable " \
           "metric in Triton core." in caplog.text
    infer_add_sub(server, http=1, grpc=1)
    text = scrape(server)

    def buckets(name: str, model: str) -> dict[str, float]:
        return {dict(labels)["le"]: count for (sample, labels), count in samples(text).items()
                if sample == f"{name}_bucket" and dict(labels)["model"] == model}
    first = buckets("nv_inference_first_response_histogram_ms", "add_sub")
    assert set(first) == {"1", "2", "4", "8", "+Inf"} and first["+Inf"] == 2
    assert set(buckets("nv_inference_first_response_histogram_ms", "plain")) == {"100", "500", "2000", "5000", "+Inf"}
    assert buckets("nv_inference_request_histogram_us", "add_sub").keys() == \
        buckets("nv_inference_request_histogram_us", "plain").keys()


def test_first_response_histogram_of_a_decoupled_model(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("repeat", REPEAT)
    server = toy_server(metrics_config=parse_metrics_config(["histogram_latencies=true"]))
    responses = []
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: responses.append((result, error)))
        tensor = grpcclient.InferInput("INPUT0", [1], "INT32")
        tensor.set_data_from_numpy(np.array([3], dtype=np.int32))
        client.async_stream_infer("repeat", [tensor])
        client.stop_stream()
    text = scrape(server)
    assert value(text, "nv_inference_first_response_histogram_ms_count", "repeat") == 1
    assert float(value(text, "nv_inference_first_response_histogram_ms_sum", "repeat")).is_integer()  # whole ms
    les = {dict(labels)["le"] for (sample, labels) in samples(text)
           if sample == "nv_inference_first_response_histogram_ms_bucket"}
    assert les == {"100", "500", "2000", "5000", "+Inf"}


def test_cache_metrics(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("cached", COUNTER)
    add_model("add_sub", ADD_SUB)
    server = toy_server(cache_config=("local", {"size": "1048576"}),
                        metrics_config=parse_metrics_config(["summary_latencies=true"]))
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([7], dtype=np.int32))
    for _ in range(3):
        client.infer("cached", [tensor])
    text = scrape(server)
    assert "# HELP nv_cache_num_hits_per_model Number of cache hits per model\n" \
           "# TYPE nv_cache_num_hits_per_model counter\n" in text
    assert value(text, "nv_cache_num_hits_per_model", "cached") == 2
    assert value(text, "nv_cache_num_misses_per_model", "cached") == 1
    assert value(text, "nv_cache_hit_duration_per_model", "cached") >= 0
    assert value(text, "nv_cache_hit_summary_per_model_count", "cached") == 2
    assert value(text, "nv_inference_request_success", "cached") == 3
    assert value(text, "nv_inference_exec_count", "cached") == 1
    sampled = samples(text)
    # As Triton: no cache families for a model without the cache, no request summary for one with it.
    assert ("nv_cache_num_hits_per_model", (("model", "add_sub"), ("version", "1"))) not in sampled
    assert ("nv_inference_request_summary_us_count", (("model", "cached"), ("version", "1"))) not in sampled


@pytest.mark.parametrize("item", ["summary_latencies", "a,b=c", "=true", "summary_latencies=maybe",
                                  "summary_quantiles=", "histogram_buckets=10,5", "histogram_buckets=1,inf"])
def test_malformed_metrics_config_is_a_start_up_error(item: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ServerError, match="--metrics-config"):
        parse_metrics_config([item])
    assert main(["--model-repository=/nonexistent", f"--metrics-config={item}"]) == 1
    assert "--metrics-config" in capsys.readouterr().err


def test_summary_quantiles_as_triton_reads_them(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    # Triton's own test value (qa/L0_metrics): "0.0.1" reads as 0.0, as std::stod reads it; the server starts.
    add_model("add_sub", ADD_SUB)
    args = build_parser().parse_args(["--metrics-config", "summary_latencies=true", "--metrics-config",
                                      "summary_quantiles=0.1:0.0.1,0.7:0.01,0.75:0.01"])
    server = toy_server(metrics_config=options_from_args(args).metrics_config)
    infer_add_sub(server, http=1, grpc=1)
    text = scrape(server)
    for name in SUMMARIES:
        quantiles = {dict(labels)["quantile"] for (sample, labels) in samples(text) if sample == name}
        assert quantiles == {"0.1", "0.7", "0.75"}
    assert value(text, "nv_inference_request_summary_us", quantile="0.75") > 0


def test_malformed_quantiles_are_skipped_as_triton_skips_them(caplog: pytest.LogCaptureFixture) -> None:
    assert parse_metrics_config(["summary_quantiles=0.3:0.1,x:1,0.4,"]).summary_quantiles == ((0.3, 0.1),)
    assert "Invalid option: [x:1]" in caplog.text and "Invalid option: [0.4]. No ':' delimiter found" in caplog.text
    assert parse_metrics_config(["summary_quantiles=0.5"]).summary_quantiles == DEFAULT_QUANTILES  # none valid
    assert parse_metrics_config(["summary_quantiles=0.2:0.1", "summary_quantiles=y"]).summary_quantiles == ((0.2, 0.1),)


def test_summaries_of_a_cached_model_as_triton(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    # Triton's qa/L0_metrics with the cache on: every summary but the request one, and the queue summary
    # counts the cached requests too.
    add_model("cached", COUNTER)
    server = toy_server(cache_config=("local", {"size": "1048576"}),
                        metrics_config=parse_metrics_config(["summary_latencies=true"]))
    tensor = httpclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([7], dtype=np.int32))
    for _ in range(3):
        httpclient.InferenceServerClient(server.http_url).infer("cached", [tensor])
    text = scrape(server)
    kinds = families(text)
    for name in [*SUMMARIES[1:], "nv_cache_hit_summary_per_model", "nv_cache_miss_summary_per_model"]:
        assert kinds[name] == "summary"
    assert "nv_inference_request_summary_us" not in text
    assert value(text, "nv_inference_queue_summary_us_count", "cached") == 3
    assert value(text, "nv_inference_compute_infer_summary_us_count", "cached") == 1
    assert value(text, "nv_cache_hit_summary_per_model_count", "cached") == 2


def test_metrics_config_defaults_and_settings() -> None:
    default = parse_metrics_config([])
    assert (default.counter_latencies, default.summary_latencies, default.histogram_latencies) == (True, False, False)
    assert default.histogram_buckets == DEFAULT_BUCKETS_US and default.latency_settings() is None
    config = parse_metrics_config(["summary_latencies=true", "summary_latencies=false", "histogram_latencies=true",
                                   "some_future_setting=1"])
    assert not config.summary_latencies and config.histogram_latencies
    assert config.unknown == ["some_future_setting"]


def test_grafana_dashboard_queries_only_exported_metrics(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("cached", COUNTER)
    config = parse_metrics_config(["histogram_latencies=true", "summary_latencies=true"])
    server = toy_server(metrics_config=config, cache_config=("local", {"size": "1048576"}))
    infer_add_sub(server, http=1, grpc=0)
    tensor = httpclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([7], dtype=np.int32))
    httpclient.InferenceServerClient(server.http_url).infer("cached", [tensor])
    text = scrape(server)
    exported = {sample for sample, _ in samples(text)} | set(families(text))
    exported |= {name for name, *_ in _GPU}  # exported where a GPU and nvidia-ml-py are present
    dashboard = json.loads(DASHBOARD.read_text())
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            queried |= set(re.findall(r"\bnv_[a-z_]+", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queried |= set(re.findall(r"\bnv_[a-z_]+", variable["definition"]))
    assert queried and queried <= exported, sorted(queried - exported)


def test_summary_quantile_of_an_empty_window_is_nan() -> None:
    from triton_serve._engine.statistics import SummaryWindow

    window = SummaryWindow()
    assert all(math.isnan(q) for q in window.quantiles([0.5, 0.9], 0))
    for number in range(1, 101):
        window.observe(float(number), 0)
    assert window.quantiles([0.5, 0.9, 0.99], 0) == [50.0, 90.0, 99.0]
