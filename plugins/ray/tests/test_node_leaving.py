"""A node leaving the cluster under load (issue 36): a two-node local cluster of its own, add_sub with a replica on
each node and the front door on the head. While clients send requests the worker node goes silent (every process
of it stopped: its connections stay open, unanswered), then is killed. Requests keep being answered (any that
fails does so UNAVAILABLE, naming the model; none waits without end), the front door stops routing to the silent
replica, and Ray brings the deployment back to two replicas on the head, which the front door routes to."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import ray
import tritonclient.http as http
from ray import serve
from tritonclient.utils import InferenceServerException

from triton_serve.plugin import RemoteDataPlane
from triton_serve.testing import free_port
from triton_serve_ray import deploy
from triton_serve_ray.local_cluster import LocalCluster, NodeSpec
from triton_serve_ray.registry import HEAD_NODE, registry_of

APP = "triton"
MODEL = "add_sub"
SECOND_NODE_IP = "127.0.0.2"
ON_HEAD = {"num_cpus": 0.1, "resources": {HEAD_NODE: 0.001}}  # the front door: the clients' entry stays
REQUEST_TIMEOUT_S = 30  # a request unanswered this long is a failure (tritonclient's network timeout)
NODE_GONE_S = 90  # Ray declares a killed node dead once it has missed its health checks
REPLACED_S = 150
A = np.arange(16, dtype=np.int32).reshape(1, 16)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def routed() -> list[str]:
    """The channel addresses the front door routes the model's requests to (the registry's table)."""
    table = cast(dict[str, list[str]], ray.get(registry_of(APP).replicas.remote(), timeout=30))
    return table.get(MODEL, [])


def running_replicas() -> int:
    states = serve.status().applications[APP].deployments[MODEL].replica_states
    return sum(count for state, count in states.items() if state == "RUNNING")  # ReplicaState is a str enum


class Load:
    """Threads sending add_sub requests through tritonclient HTTP and checking each answer until stopped,
    counting each thread's answers; a failure is kept with its HTTP status and message."""

    def __init__(self, url: str, threads: int) -> None:
        self.url = url
        self.answered = [0] * threads
        self.failures: list[tuple[str | None, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(2 * REQUEST_TIMEOUT_S)
        assert not any(thread.is_alive() for thread in self._threads), "a request of the load hung"

    def _run(self, number: int) -> None:
        client = http.InferenceServerClient(self.url, network_timeout=REQUEST_TIMEOUT_S)
        inputs = [http.InferInput("INPUT0", [1, 16], "INT32"), http.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(A)
        inputs[1].set_data_from_numpy(A)
        while not self._stop.is_set():
            try:
                np.testing.assert_array_equal(client.infer(MODEL, inputs).as_numpy("OUTPUT0"), 2 * A)
            except InferenceServerException as error:
                with self._lock:
                    self.failures.append((error.status(), error.message()))
            except Exception as error:  # noqa: BLE001 - a wrong answer or a timeout: kept, and the test fails
                with self._lock:
                    self.failures.append((None, f"{type(error).__name__}: {error}"))
            else:
                self.answered[number] += 1

    def each_answered(self, count: int, timeout: float, what: str) -> None:
        """Wait until every thread has ``count`` more answers: none is held by a request that went nowhere."""
        start = list(self.answered)
        wait_until(lambda: all(now >= then + count for now, then in zip(self.answered, start)), timeout, what)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A head and a worker node (127.0.0.2), with Serve and without its HTTP proxy."""
    nodes = LocalCluster([NodeSpec(2), NodeSpec(2, ip=SECOND_NODE_IP)], start_timeout_s=180)
    try:
        nodes.start()
        ray.init(address=nodes.address, log_to_driver=False)
        wait_until(lambda: sum(node["Alive"] for node in ray.nodes()) == 2, 60, "both nodes in the cluster")
        serve.start(proxy_location="Disabled")
        yield nodes
    finally:
        if len(nodes.processes) == 2:  # the worker node's processes, frozen or not, are killed (their groups too)
            nodes.kill_node(1)
        serve.shutdown()
        ray.shutdown()
        nodes.stop()


def inference_count(address: str) -> int:
    """The model's inference count as one replica counts it, asked over its channel."""
    async def ask() -> int:
        link = RemoteDataPlane()
        host, port = address.rsplit(":", 1)
        await link.connect_tcp(host, int(port))
        try:
            return int((await link.model_statistics(MODEL))[0]["inference_count"])
        finally:
            link.close()
    return asyncio.run(asyncio.wait_for(ask(), 60))


def test_a_node_leaving_under_load_is_survived_and_its_replica_replaced(cluster: LocalCluster,
                                                                         example_repository: Path) -> None:
    port = free_port()
    deploy(str(example_repository), name=APP, models=[MODEL], host="127.0.0.1", http_port=port,
           grpc_port=free_port(), ingress_options={"ray_actor_options": ON_HEAD},
           deployment_options={MODEL: {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.1}}})
    wait_until(lambda: len(routed()) == 2, 60, "both replicas in the routing table")
    before = routed()
    lost = [address for address in before if address.startswith(f"{SECOND_NODE_IP}:")]
    assert len(lost) == 1, f"Ray spreads replicas over the nodes: one on each expected, routed {before}"
    with Load(f"127.0.0.1:{port}", threads=3) as load:
        load.each_answered(5, 60, "answers before the node leaves")
        cluster.freeze_node(1)  # silent: its connections stay open, nothing on it answers or reports
        wait_until(lambda: lost[0] not in routed(), 30, "the silent replica out of the routing table")
        load.each_answered(20, 30, "every client answered while the node is silent (before it is killed)")
        assert http.InferenceServerClient(f"127.0.0.1:{port}").is_server_ready()  # add_sub has a replica left
        assert cluster.kill_node(1) == -9  # gone for good
        wait_until(lambda: sum(node["Alive"] for node in ray.nodes()) == 1, NODE_GONE_S, "Ray to see the node gone")
        wait_until(lambda: running_replicas() == 2 and len(routed()) == 2, REPLACED_S,
                   "Ray to replace the lost replica on the head")
        [replacement] = set(routed()) - set(before)
        assert not replacement.startswith(f"{SECOND_NODE_IP}:")
        counted = inference_count(replacement)
        wait_until(lambda: inference_count(replacement) > counted + 20, 60,
                   "the front door to send requests to the replacement")
    unexpected = [(status, message) for status, message in load.failures
                  if status != "503" or f"model '{MODEL}' is unavailable" not in message]
    assert not unexpected, unexpected[:5]
