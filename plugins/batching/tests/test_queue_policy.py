"""The dynamic batcher's queue policies as Triton 2.51 applies and counts them, through tritonclient HTTP
and gRPC and ``/metrics``, with front-ends in the server's process and in front-end processes:
request timeouts under ``allow_timeout_override``, rejections in ``nv_inference_request_failure``
(ensembles too), and priority levels up to the largest value Triton accepts."""
from __future__ import annotations

import concurrent.futures
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.utils import InferenceServerException

from triton_serve.plugin import InferenceRequest, ModelConfig
from triton_serve.testing import RunningServer, ToyBackendsPlugin, probe_config
from triton_serve_batching.queues import PriorityQueue

CLIENT_TIMEOUT_S = 15
WAIT_S = 10  # the longest a test waits for the server to reach a state
MAX_UINT64 = 2**64 - 1
NO_FAILURES = {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}


@pytest.fixture(params=[0, 2], ids=lambda count: f"frontend_processes={count}")
def serve_models(request: pytest.FixtureRequest, tserve: Any, tmp_path: Path) -> Callable[..., RunningServer]:
    """``serve_models({name: config_text})``: serve those models with the toy backends, with front-ends
    in the server's process or in two front-end processes."""
    def start(models: dict[str, str]) -> RunningServer:
        for name, config in models.items():
            (tmp_path / "models" / name / "1").mkdir(parents=True)
            (tmp_path / "models" / name / "config.pbtxt").write_text(config)
        server: RunningServer = tserve(tmp_path / "models", extra_plugins=[("toy", ToyBackendsPlugin())],
                                       frontend_processes=request.param)
        return server
    return start


def _ensemble_of(model: str) -> str:
    """An ensemble of one step, ``model`` (a probe): it takes DELAY and returns the step's EXECUTION."""
    return f"""
platform: "ensemble"
max_batch_size: 1
input [ {{ name: "DELAY" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "EXECUTION" data_type: TYPE_INT64 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{model}" model_version: -1 input_map {{ key: "INPUT0" value: "DELAY" }}
                                 output_map {{ key: "EXECUTION" value: "EXECUTION" }} }} ] }}
"""


def _infer(server: RunningServer, model: str, module: Any = httpclient, delay: float = 0.0,
           **options: Any) -> int:
    """One request (the probe sleeps ``delay`` seconds); the number of the execution that ran it."""
    name = "DELAY" if model.startswith("into_") else "INPUT0"
    tensor = module.InferInput(name, [1, 1], "FP32")
    tensor.set_data_from_numpy(np.full((1, 1), delay, np.float32))
    if module is httpclient:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=CLIENT_TIMEOUT_S)
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        options["client_timeout"] = CLIENT_TIMEOUT_S
    return int(client.infer(model, [tensor], **options).as_numpy("EXECUTION")[0, 0])


def _timed(server: RunningServer, model: str, module: Any = httpclient, **kwargs: Any) -> tuple[Any, float, float]:
    """``_infer``'s result, or the error it raised, with when the call started and ended."""
    start = time.monotonic()
    try:
        outcome: Any = _infer(server, model, module, **kwargs)
    except InferenceServerException as error:
        outcome = error
    return outcome, start, time.monotonic()


def _metric(server: RunningServer, name: str, model: str, **labels: str) -> float:
    """One sample of ``/metrics``, its labels in Triton's order (model, reason, version)."""
    written = ",".join(f'{k}="{v}"' for k, v in {"model": model, **labels, "version": "1"}.items())
    text = httpx.get(server.metrics_url, timeout=10).text
    found = re.search(rf"^{name}\{{{re.escape(written)}\}} (\S+)$", text, re.MULTILINE)
    assert found, f"no {name}{{{written}}}"
    return float(found.group(1))


def _failures(server: RunningServer, model: str) -> dict[str, float]:
    return {reason: _metric(server, "nv_inference_request_failure", model, reason=reason) for reason in NO_FAILURES}


def _stats(server: RunningServer, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(model)
    return stats["model_stats"][0]  # type: ignore[no-any-return]


def _wait_pending(server: RunningServer, model: str, count: int) -> None:
    """Wait until ``count`` requests of ``model`` wait in its queue."""
    deadline = time.monotonic() + WAIT_S
    while _metric(server, "nv_inference_pending_request_count", model) != count:
        assert time.monotonic() < deadline, f"'{model}' never had {count} pending requests"
        time.sleep(0.02)


def _wait_started(server: RunningServer, model: str) -> None:
    """Wait until a request of ``model`` has left its queue to execute."""
    deadline = time.monotonic() + WAIT_S
    while int(_stats(server, model)["inference_stats"]["queue"]["count"]) < 1:
        assert time.monotonic() < deadline, f"no request of '{model}' started"
        time.sleep(0.02)


def test_a_request_timeout_only_shortens_the_policy_timeout(serve_models) -> None:  # type: ignore[no-untyped-def]
    server = serve_models({
        "override": probe_config(1) + """dynamic_batching { default_queue_policy {
            default_timeout_microseconds: 800000 allow_timeout_override: true } }""",
        "fixed": probe_config(1) + "dynamic_batching { default_queue_policy { default_timeout_microseconds: 5000000 } }",
    })
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        blocker = pool.submit(_timed, server, "override", delay=1.8)
        fixed_blocker = pool.submit(_infer, server, "fixed", delay=0.6)
        _wait_started(server, "override")
        _wait_started(server, "fixed")  # both execute: what follows waits in the queues
        shorter = pool.submit(_timed, server, "override", timeout=50_000)
        longer = pool.submit(_timed, server, "override", timeout=10_000_000)
        ignored = pool.submit(_infer, server, "fixed", grpcclient, timeout=50_000)
        (_, _, blocker_end), (error, start, end), (late_error, late_start, late_end) = (
            blocker.result(), shorter.result(), longer.result())
        assert (fixed_blocker.result(), ignored.result()) == (1, 2)
    # 50 ms < 800 ms: the request's timeout wins, and it is rejected while the instance is still busy.
    assert isinstance(error, InferenceServerException), error
    assert error.status() == "503" and error.message() == "Request timeout expired"
    assert end < blocker_end - 0.8 and end - start < late_end - late_start - 0.4
    # 10 s > 800 ms: a request cannot lengthen the policy's timeout.
    assert isinstance(late_error, InferenceServerException), late_error
    assert late_error.status() == "503" and late_error.message() == "Request timeout expired"
    assert late_end - late_start >= 0.75 and late_end < blocker_end
    # Without allow_timeout_override the request's 50 ms were ignored (no error): it waited its turn and ran.
    assert _failures(server, "override") == {**NO_FAILURES, "REJECTED": 2}
    assert _failures(server, "fixed") == NO_FAILURES


def test_rejections_count_as_triton_counts_them(serve_models) -> None:  # type: ignore[no-untyped-def]
    server = serve_models({
        "full": probe_config(1) + "dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
        "timed": probe_config(1) + "dynamic_batching { default_queue_policy { default_timeout_microseconds: 300000 } }",
        "into_full": _ensemble_of("full"),
        "into_timed": _ensemble_of("timed"),
    })
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        blockers = [pool.submit(_infer, server, model, delay=1.5) for model in ("full", "timed")]
        _wait_started(server, "full")
        _wait_started(server, "timed")  # both execute: requests now wait in the queues
        timing_out = [pool.submit(_timed, server, "timed", grpcclient), pool.submit(_timed, server, "into_timed")]
        queued = pool.submit(_infer, server, "full")
        _wait_pending(server, "full", 1)  # the queue of "full" holds its one request
        with pytest.raises(InferenceServerException) as full:
            _infer(server, "full", grpcclient)
        assert full.value.status() == "StatusCode.UNAVAILABLE"
        assert full.value.message() == "[request id: <id_unknown>] Exceeds maximum queue size"  # Triton's text
        with pytest.raises(InferenceServerException, match="Exceeds maximum queue size") as full:
            _infer(server, "into_full")
        assert full.value.status() == "503"
        direct, stepped = (future.result()[0] for future in timing_out)
        assert isinstance(direct, InferenceServerException) and direct.message() == "Request timeout expired"
        assert isinstance(stepped, InferenceServerException)
        assert stepped.message() == "in ensemble 'into_timed', Request timeout expired"
        assert [blocker.result() for blocker in blockers] == [1, 1] and queued.result() == 2
    # As Triton: a queue timeout counts as REJECTED, a full queue not at all; an ensemble counts each of its
    # failed requests twice, as OTHER (qa/L0_model_queue test_policy_reject, docs/user_guide/metrics.md).
    assert _failures(server, "full") == NO_FAILURES
    assert _failures(server, "timed") == {**NO_FAILURES, "REJECTED": 2}
    assert _failures(server, "into_full") == _failures(server, "into_timed") == {**NO_FAILURES, "OTHER": 2}
    fails = {model: int(_stats(server, model)["inference_stats"]["fail"]["count"])
             for model in ("full", "timed", "into_full", "into_timed")}
    assert fails == {"full": 0, "timed": 2, "into_full": 2, "into_timed": 2}
    assert _metric(server, "nv_inference_pending_request_count", "timed") == 0  # the rejected left the queue


def test_the_largest_priority_levels_cost_nothing_until_used(serve_models, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Triton's qa/L0_model_queue test_max_priority_levels: 2**64 - 1 levels, the default one past 2**32.
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    server = serve_models({"levels": probe_config(1) + f"""dynamic_batching {{ max_queue_delay_microseconds: 0
        priority_levels: {MAX_UINT64} default_priority_level: 4294967296
        priority_queue_policy {{ key: 1 value: {{ max_queue_size: 4 }} }} }}"""})
    assert httpclient.InferenceServerClient(server.http_url).is_model_ready("levels")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        lowest = pool.submit(_infer, server, "levels", priority=MAX_UINT64)
        _wait_pending(server, "levels", 1)
        default = pool.submit(_infer, server, "levels", grpcclient)
        _wait_pending(server, "levels", 2)
        highest = pool.submit(_infer, server, "levels", grpcclient, priority=1)
        assert (highest.result(), default.result(), lowest.result()) == (1, 2, 3)


def test_priority_levels_exist_only_while_used() -> None:
    levels = 10**6  # enough to notice levels made ahead of use; the test above serves 2**64 - 1
    config = text_format.Parse(f"""dynamic_batching {{ priority_levels: {levels} default_priority_level: 7
        priority_queue_policy {{ key: 3 value: {{ max_queue_size: 1 }} }} }}""", ModelConfig()).dynamic_batching
    queue = PriorityQueue("levels", config)
    assert queue._order == [3, 7]  # the level with its own policy, and the default one
    for priority in (levels, 0, 3, levels + 1):
        request = InferenceRequest("levels")
        request.priority = priority
        queue.push(request, 1)
    assert [entry.request.priority for entry in queue.in_order()] == [3, 0, levels + 1, levels]
    assert queue._order == [3, 7, levels] and len(queue) == 4
    assert len(queue.pop_front(4)) == 4
    assert queue._order == [3, 7] and len(queue) == 0  # the level made for one request went with it
