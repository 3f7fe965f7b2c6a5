"""The dynamic batcher through tritonclient HTTP and gRPC, proven by outputs and statistics."""
from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.utils import InferenceServerException

from triton_serve.plugin import (InferenceClient, InferenceRequest, InferenceResponse, InstancePool, InstanceSpec,
                                 ModelConfig, ModelContext, ModelInstance, ModelInstanceGroup, ModelSpec, ServerError,
                                 Status, Tensor)
from triton_serve.testing import ProbeBackend, probe_config
from triton_serve_batching.dynamic import DynamicBatcher


def _inputs(module: Any, delay: float = 0.0, rows: int = 1, width: int = 1) -> list[Any]:
    tensor = module.InferInput("INPUT0", [rows, width], "FP32")
    tensor.set_data_from_numpy(np.full((rows, width), delay, np.float32))
    return [tensor]


CLIENT_TIMEOUT_S = 15  # a request that waits longer than this fails the test


def _infer(server: Any, module: Any = httpclient, **kwargs: Any) -> dict[str, int]:
    """One request (its own client); returns the execution number and batch size it ran in, and how
    many executions of the model had run at once by then."""
    request_options = {k: kwargs.pop(k) for k in ("priority", "timeout") if k in kwargs}
    if module is httpclient:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=CLIENT_TIMEOUT_S)
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        request_options["client_timeout"] = CLIENT_TIMEOUT_S
    result = client.infer("probe", _inputs(module, **kwargs), **request_options)
    return {name.lower(): int(result.as_numpy(name)[0, 0]) for name in ("EXECUTION", "BATCH", "PEAK")}


def _concurrently(calls: list[Any], stagger_s: float = 0.0) -> list[Any]:
    """Run the calls on threads, started ``stagger_s`` apart; results (or exceptions) in call order."""
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = []
        for call in calls:
            futures.append(pool.submit(call))
            time.sleep(stagger_s)
        results = []
        for future in futures:
            try:
                results.append(future.result())
            except InferenceServerException as error:
                results.append(error)
        return results


def _stats(server: Any) -> dict[str, Any]:
    return httpclient.InferenceServerClient(server.http_url).get_inference_statistics("probe")["model_stats"][0]


def _batch_sizes(stats: dict[str, Any]) -> dict[int, int]:
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_concurrent_requests_under_a_long_delay_form_one_full_batch(serve_probe, module) -> None:
    # A full batch goes at once: waiting out the 60 s delay would exceed the clients' timeout.
    server = serve_probe("dynamic_batching { max_queue_delay_microseconds: 60000000 }", max_batch_size=4)
    results = _concurrently([lambda: _infer(server, module)] * 4)
    assert {r["batch"] for r in results} == {4} and {r["execution"] for r in results} == {1}
    stats = _stats(server)
    assert stats["execution_count"] == 1 and stats["inference_count"] == 4
    assert _batch_sizes(stats) == {4: 1}
    assert stats["inference_stats"]["success"]["count"] == 4
    assert stats["inference_stats"]["queue"]["count"] == 4


def test_delay_expiry_sends_a_partial_batch(serve_probe) -> None:
    server = serve_probe("dynamic_batching { max_queue_delay_microseconds: 300000 }", max_batch_size=8)
    results = _concurrently([lambda: _infer(server)] * 3)
    assert [r["batch"] for r in results] == [3, 3, 3]
    assert _batch_sizes(_stats(server)) == {3: 1}


def test_a_request_with_batch_dimension_n_counts_as_n(serve_probe, monkeypatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    server = serve_probe("dynamic_batching { max_queue_delay_microseconds: 100000 }", max_batch_size=4)
    results = _concurrently([lambda: _infer(server, rows=2), lambda: _infer(server, rows=2),
                             lambda: _infer(server, rows=3)], stagger_s=0.05)
    # 2 + 2 fill the batch of 4; the request of 3 cannot join it and runs alone.
    assert [r["batch"] for r in results] == [4, 4, 3]
    stats = _stats(server)
    assert _batch_sizes(stats) == {4: 1, 3: 1} and stats["inference_count"] == 7


def test_preferred_batch_size_is_sent_without_waiting_for_the_delay(serve_probe, monkeypatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    server = serve_probe("dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 400000 }")
    results = _concurrently([lambda: _infer(server)] * 3, stagger_s=0.02)
    # Three queued: the preferred 2 go at once, the third waits out the queue delay alone.
    assert sorted(r["batch"] for r in results) == [1, 2, 2]
    assert _batch_sizes(_stats(server)) == {1: 1, 2: 1}


def test_shapes_that_cannot_batch_run_apart(serve_probe, monkeypatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    server = serve_probe("dynamic_batching { max_queue_delay_microseconds: 100000 }")
    results = _concurrently([lambda: _infer(server, width=2), lambda: _infer(server, width=3)], stagger_s=0.05)
    assert [r["batch"] for r in results] == [1, 1]
    assert _batch_sizes(_stats(server)) == {1: 2}


def test_ragged_inputs_batch_despite_different_shapes(serve_probe, monkeypatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    server = serve_probe("dynamic_batching { max_queue_delay_microseconds: 100000 }", ragged=True)
    results = _concurrently([lambda: _infer(server, width=2), lambda: _infer(server, width=3)], stagger_s=0.05)
    assert [r["batch"] for r in results] == [2, 2]


def test_priorities_reorder_the_queue(serve_probe, monkeypatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    server = serve_probe("""
dynamic_batching { max_queue_delay_microseconds: 0 priority_levels: 2 default_priority_level: 2 }""",
                         max_batch_size=1)
    low1, high, low2 = _concurrently([lambda: _infer(server), lambda: _infer(server, priority=1),
                                      lambda: _infer(server, module=grpcclient, priority=2)], stagger_s=0.1)
    assert high["execution"] == 1
    assert (low1["execution"], low2["execution"]) == (2, 3)


def test_a_priority_past_the_levels_takes_the_default_level(serve_probe, monkeypatch) -> None:
    # As Triton's InferenceRequest::SetPriority: no error, the request queues at the default level.
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    server = serve_probe("""
dynamic_batching { max_queue_delay_microseconds: 0 priority_levels: 2 default_priority_level: 2 }""",
                         max_batch_size=1)
    past, high, default = _concurrently([lambda: _infer(server, priority=3), lambda: _infer(server, priority=1),
                                         lambda: _infer(server, module=grpcclient)], stagger_s=0.1)
    assert (high["execution"], past["execution"], default["execution"]) == (1, 2, 3)


def test_full_queue_answers_503_and_grpc_unavailable(serve_probe) -> None:
    server = serve_probe("dynamic_batching { default_queue_policy { max_queue_size: 1 } }", max_batch_size=1)
    blocker = concurrent.futures.ThreadPoolExecutor(2)
    running = blocker.submit(_infer, server, delay=1.0)
    time.sleep(0.3)  # the blocker executes; the queue is empty
    queued = blocker.submit(_infer, server)
    time.sleep(0.2)  # one request waits: the queue is full
    response = httpx.post(f"http://{server.http_url}/v2/models/probe/infer", json={"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]})
    assert response.status_code == 503
    assert response.json()["error"] == "[request id: <id_unknown>] Exceeds maximum queue size"  # Triton's text
    with pytest.raises(InferenceServerException) as raised:
        _infer(server, module=grpcclient)
    assert raised.value.status() == "StatusCode.UNAVAILABLE"
    assert running.result()["execution"] == 1 and queued.result()["execution"] == 2
    blocker.shutdown()
    assert _infer(server)["execution"] == 3  # the queue works again


def test_queue_timeout_rejects(serve_probe) -> None:
    server = serve_probe("dynamic_batching { default_queue_policy { default_timeout_microseconds: 100000 } }",
                         max_batch_size=1)
    blocked, late = _concurrently([lambda: _infer(server, delay=0.5), lambda: _infer(server)], stagger_s=0.15)
    assert blocked["execution"] == 1
    assert isinstance(late, InferenceServerException)
    assert late.status() == "503" and "Request timeout expired" in late.message()
    stats = _stats(server)
    assert stats["inference_stats"]["fail"]["count"] == 1 and stats["execution_count"] == 1


def test_queue_timeout_delays_behind_requests_that_did_not_expire(serve_probe) -> None:
    server = serve_probe("""
dynamic_batching { default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 10000000
                                          allow_timeout_override: true } }""", max_batch_size=1)
    # The blocker runs 0.5 s; the first waiter's 100 ms timeout expires, the second's 10 s do not.
    blocker, expired, patient = _concurrently([
        lambda: _infer(server, delay=0.5), lambda: _infer(server, timeout=100_000), lambda: _infer(server)],
        stagger_s=0.15)
    assert blocker["execution"] == 1
    assert patient["execution"] == 2 and expired["execution"] == 3


@pytest.mark.parametrize("preserve", [True, False])
def test_preserve_ordering_answers_in_arrival_order(tmp_path, preserve: bool) -> None:
    """A slow request, then a fast one, on two instances: the fast one is answered first unless
    preserve_ordering holds it back. Run on the batcher directly, where the order in which the
    responses reach their consumers is exact."""
    config = text_format.Parse(probe_config(max_batch_size=1) + f"""
dynamic_batching {{ preserve_ordering: {str(preserve).lower()} }}""", ModelConfig(name="probe"))
    spec = ModelSpec("probe", 1, config, tmp_path, tmp_path / "1")
    model = ProbeBackend().create_model(spec)  # its load and its instances' loads do nothing
    instances = [model.create_instance(InstanceSpec(f"probe_{i}", ModelInstanceGroup(), i, "CPU")) for i in range(2)]

    def request(delay: float) -> InferenceRequest:
        data = np.full((1, 1), delay, np.float32)
        return InferenceRequest("probe", 1, inputs={"INPUT0": Tensor("INPUT0", "FP32", (1, 1), data)})

    async def scenario() -> list[str]:
        pool = InstancePool(spec, instances)
        batcher = DynamicBatcher(ModelContext(spec, pool, pool.stats, InferenceClient()))
        await batcher.start()
        received: list[str] = []

        async def consume(name: str, made: InferenceRequest) -> None:
            assert (await made.single_response()).error is None
            received.append(name)

        slow, fast = request(0.3), request(0.0)
        batcher.enqueue(slow)
        batcher.enqueue(fast)
        await asyncio.gather(consume("slow", slow), consume("fast", fast))
        await batcher.stop()
        return received

    assert asyncio.run(scenario()) == (["slow", "fast"] if preserve else ["fast", "slow"])


def test_two_instances_serve_two_requests_at_once(serve_probe) -> None:
    server = serve_probe("dynamic_batching { }\ninstance_group [ { count: 2 kind: KIND_CPU } ]", max_batch_size=1)
    results = _concurrently([lambda: _infer(server, delay=0.5)] * 2)
    assert [r["batch"] for r in results] == [1, 1]
    assert max(r["peak"] for r in results) == 2  # the two executions overlapped
    assert _stats(server)["execution_count"] == 2


def test_server_metadata_lists_schedule_policy(serve_probe) -> None:
    server = serve_probe("dynamic_batching { }")
    extensions = httpclient.InferenceServerClient(server.http_url).get_server_metadata()["extensions"]
    assert "schedule_policy" in extensions and "statistics" in extensions


def test_priority_queue_policy_applies_per_level(serve_probe) -> None:
    server = serve_probe("""
dynamic_batching { priority_levels: 2 default_priority_level: 2
                   priority_queue_policy { key: 2 value: { max_queue_size: 1 } } }""", max_batch_size=1)
    pool = concurrent.futures.ThreadPoolExecutor(3)
    running = pool.submit(_infer, server, delay=0.6)
    time.sleep(0.2)
    queued_low = pool.submit(_infer, server, priority=2)
    time.sleep(0.1)
    with pytest.raises(InferenceServerException) as raised:  # level 2 holds its one request
        _infer(server, priority=2)
    assert raised.value.status() == "503"
    queued_high = pool.submit(_infer, server, priority=1)  # level 1 has no limit, and goes first
    assert running.result()["execution"] == 1
    assert queued_high.result()["execution"] == 2 and queued_low.result()["execution"] == 3
    pool.shutdown()


# ---- Triton's batch-forming rules (DynamicBatchScheduler::GetDynamicBatch) ----------------------

HUGE_DELAY = "max_queue_delay_microseconds: 60000000"  # far past CLIENT_TIMEOUT_S: a batch that waits fails


def _submit(pool: concurrent.futures.Executor, calls: list[Any], stagger_s: float) -> list[concurrent.futures.Future]:
    """Start the calls ``stagger_s`` apart, so that they reach the queue in this order."""
    futures = []
    for call in calls:
        futures.append(pool.submit(call))
        time.sleep(stagger_s)
    return futures


def _wait_for(futures: list[concurrent.futures.Future], count: int) -> None:
    """Wait until ``count`` of the futures are done (each within the clients' timeout)."""
    for done, _ in enumerate(concurrent.futures.as_completed(futures, timeout=CLIENT_TIMEOUT_S + 5), 1):
        if done == count:
            return


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_batch_that_reaches_a_preferred_size_goes_at_once(serve_probe, module) -> None:
    server = serve_probe(f"dynamic_batching {{ preferred_batch_size: [ 3, 6 ] {HUGE_DELAY} }}", max_batch_size=8)
    results = _concurrently([lambda: _infer(server, module, rows=1), lambda: _infer(server, module, rows=2)])
    assert [r["batch"] for r in results] == [3, 3] and {r["execution"] for r in results} == {1}
    stats = _stats(server)
    assert _batch_sizes(stats) == {3: 1} and stats["execution_count"] == 1 and stats["inference_count"] == 3


def test_a_queue_past_the_largest_preferred_size_sends_its_largest_preferred_prefix(serve_probe, monkeypatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "5")
    server = serve_probe(f"dynamic_batching {{ preferred_batch_size: [ 2, 4 ] {HUGE_DELAY} }}", max_batch_size=8)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        queued = _submit(pool, [lambda: _infer(server)] * 2 + [lambda: _infer(server, grpcclient)] * 3, 0.05)
        _wait_for(queued, 4)  # five queued: the preferred 4 go at once, the fifth waits
        joining = pool.submit(_infer, server)  # with it the fifth makes the preferred 2
        results = [future.result() for future in [*queued, joining]]
    assert sorted(r["batch"] for r in results) == [2, 2, 4, 4, 4, 4]
    stats = _stats(server)
    assert _batch_sizes(stats) == {4: 1, 2: 1} and stats["execution_count"] == 2


def test_without_a_preferred_prefix_the_largest_prefix_within_the_largest_preferred_size_goes(
        serve_probe, monkeypatch) -> None:
    # Rows 3, 2, 2 pass the largest preferred size 6 and no prefix is 4 or 6: Triton sends 3 + 2 at
    # once (the largest prefix that fits 6, not the 7 that fits max_batch_size); the last 2 waits.
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    server = serve_probe(f"dynamic_batching {{ preferred_batch_size: [ 4, 6 ] {HUGE_DELAY} }}", max_batch_size=8)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        queued = _submit(pool, [lambda: _infer(server, rows=3), lambda: _infer(server, grpcclient, rows=2),
                                lambda: _infer(server, rows=2)], 0.2)
        _wait_for(queued, 2)
        joining = pool.submit(_infer, server, grpcclient, rows=2)  # 2 + 2 make the preferred 4
        results = [future.result() for future in [*queued, joining]]
    assert [r["batch"] for r in results] == [5, 5, 4, 4]
    assert [r["execution"] for r in results] == [1, 1, 2, 2]
    assert _batch_sizes(_stats(server)) == {5: 1, 4: 1}


def test_without_preferred_sizes_the_largest_prefix_that_fits_max_batch_size_goes(serve_probe, monkeypatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    server = serve_probe(f"dynamic_batching {{ {HUGE_DELAY} }}", max_batch_size=4)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        queued = _submit(pool, [lambda: _infer(server, rows=3), lambda: _infer(server, grpcclient, rows=2)], 0.2)
        _wait_for(queued, 1)  # 3 + 2 pass max_batch_size 4: the 3 goes at once, the 2 waits
        joining = pool.submit(_infer, server, rows=2)  # 2 + 2 fill max_batch_size
        results = [future.result() for future in [*queued, joining]]
    assert [r["batch"] for r in results] == [3, 4, 4]
    assert _batch_sizes(_stats(server)) == {3: 1, 4: 1}


def test_without_preferred_sizes_a_partial_batch_waits_out_the_delay(serve_probe) -> None:
    server = serve_probe("dynamic_batching { max_queue_delay_microseconds: 300000 }", max_batch_size=4)
    assert _infer(server, rows=3)["batch"] == 3
    stats = _stats(server)
    assert _batch_sizes(stats) == {3: 1}
    assert int(stats["inference_stats"]["queue"]["ns"]) >= 300_000_000  # it was held for the delay


def test_once_the_delay_has_passed_a_batch_is_not_held_to_a_preferred_size(serve_probe, monkeypatch) -> None:
    # The third request arrives 0.4 s after the first, past the 0.1 s delay: all three go together,
    # not the preferred 2 and then 1.
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    server = serve_probe("dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 100000 }")
    results = _concurrently([lambda: _infer(server)] * 3, stagger_s=0.2)
    assert [r["batch"] for r in results] == [3, 3, 3]
    assert _batch_sizes(_stats(server)) == {3: 1}


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_the_largest_preferred_prefix_goes_even_when_max_batch_size_is_full(serve_probe, module, monkeypatch) -> None:
    # Four queued with preferred 2 and max_batch_size 4: the largest preferred prefix (2) goes, not
    # the full 4; the other 2 are a preferred batch themselves.
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    server = serve_probe(f"dynamic_batching {{ preferred_batch_size: [ 2 ] {HUGE_DELAY} }}", max_batch_size=4)
    results = _concurrently([lambda: _infer(server, module)] * 4, stagger_s=0.02)
    assert [r["batch"] for r in results] == [2, 2, 2, 2]
    assert _batch_sizes(_stats(server)) == {2: 2}


class _GatedInstance(ModelInstance):
    """An instance that could take 8 batches at once (as a Python model's worker) and ends each batch only
    when the test says: ``runs`` holds each execution's requests, ``gates`` what ends it."""

    max_batches_in_flight = 8

    def __init__(self) -> None:
        self.runs: list[list[InferenceRequest]] = []
        self.gates: list[asyncio.Event] = []
        self.open = False  # set: every execution ends at once

    async def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse]:
        self.runs.append(list(requests))
        self.gates.append(asyncio.Event())
        if not self.open:
            await self.gates[-1].wait()
        return [InferenceResponse() for _ in requests]

    def open_all(self) -> None:
        self.open = True
        for gate in self.gates:
            gate.set()


def _gated_scenario(tmp_path: Any, extra_config: str, steps: Callable[..., Any]) -> Any:
    """Run ``steps(batcher, instance, request)`` on a batcher over one gated instance (max_batch_size 16)."""
    config = text_format.Parse(probe_config(max_batch_size=16) + extra_config, ModelConfig(name="probe"))
    spec = ModelSpec("probe", 1, config, tmp_path, tmp_path / "1")
    instance = _GatedInstance()

    def request() -> InferenceRequest:
        return InferenceRequest("probe", 1, inputs={"INPUT0": Tensor("INPUT0", "FP32", (1, 1),
                                                                     np.zeros((1, 1), np.float32))})

    async def scenario() -> Any:
        pool = InstancePool(spec, [instance])
        batcher = DynamicBatcher(ModelContext(spec, pool, pool.stats, InferenceClient()))
        await batcher.start()
        try:
            return await asyncio.wait_for(steps(batcher, instance, request), 30)
        finally:
            instance.open_all()
            await asyncio.wait_for(batcher.stop(), 30)

    return asyncio.run(scenario())


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def test_requests_arriving_while_a_batch_runs_stay_queued_for_the_next_batch(tmp_path) -> None:
    """Triton's DynamicBatchScheduler: a batch leaves the queue when an instance can start it, even an instance
    that takes several batches at once; 1 + 11 requests run as 2 executions."""
    async def steps(batcher: DynamicBatcher, instance: _GatedInstance, request: Callable[[], InferenceRequest]) -> Any:
        batcher.enqueue(request())
        await _until(lambda: len(instance.runs) == 1)
        for _ in range(11):
            batcher.enqueue(request())
        for _ in range(10):
            await asyncio.sleep(0)
        queued = len(batcher.queue)
        instance.gates[0].set()
        await _until(lambda: len(instance.runs) == 2)
        return queued, [len(run) for run in instance.runs]

    assert _gated_scenario(tmp_path, "dynamic_batching { }", steps) == (11, [1, 11])


def test_a_full_queue_counts_what_waits_while_a_batch_runs(tmp_path) -> None:
    """Triton: with max_queue_size 8, while a batch of 8 runs, 10 more requests: 8 wait, 2 are refused."""
    async def steps(batcher: DynamicBatcher, instance: _GatedInstance, request: Callable[[], InferenceRequest]) -> Any:
        batcher.enqueue(request())
        await _until(lambda: len(instance.runs) == 1)
        for _ in range(8):
            batcher.enqueue(request())
        instance.gates[0].set()
        await _until(lambda: len(instance.runs) == 2)
        refused = []
        for _ in range(10):
            try:
                batcher.enqueue(request())
            except ServerError as error:
                refused.append((error.status, error.message))
            await asyncio.sleep(0)
        return [len(run) for run in instance.runs], refused

    sizes, refused = _gated_scenario(tmp_path, "dynamic_batching { default_queue_policy { max_queue_size: 8 } }",
                                     steps)
    assert sizes == [1, 8]
    assert refused == [(Status.UNAVAILABLE, "[request id: <id_unknown>] Exceeds maximum queue size")] * 2


def test_a_batch_cancelled_before_it_runs_gives_its_instance_back(tmp_path) -> None:
    """A request cancelled after its batch was formed, before the batch reached the model: it is answered CANCELLED
    without running, and the instance takes the next batch (it would wait for it forever otherwise)."""
    async def steps(batcher: DynamicBatcher, instance: _GatedInstance, request: Callable[[], InferenceRequest]) -> Any:
        instance.open = True
        cancelled = request()
        batcher.enqueue(cancelled)
        await asyncio.sleep(0)  # the batch is formed in this turn; its task runs after this step
        assert len(batcher.queue) == 0 and not instance.runs
        cancelled.cancel()
        error = (await cancelled.single_response()).error
        later = request()
        batcher.enqueue(later)
        assert (await later.single_response()).error is None
        return error.status if error else None, [len(run) for run in instance.runs]

    assert _gated_scenario(tmp_path, "dynamic_batching { }", steps) == (Status.CANCELLED, [1])
