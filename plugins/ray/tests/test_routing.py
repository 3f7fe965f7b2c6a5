"""The front door's routing without Ray: ``ChannelDataPlane`` over the channel to real model owners (processes
serving add_sub on a TCP channel port), a routing table the test controls, readiness, and a replica killed
under load."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from triton_serve.plugin import InferenceRequest, InferenceResponse, ServerError, Status, Tensor, infer_one
from triton_serve_ray import routing
from triton_serve_ray.routing import ChannelDataPlane
from triton_serve_ray.statistics import summed

# A model owner serving its data plane on a channel port: prints the port, serves until killed.
REPLICA = """
import asyncio, sys
from triton_serve.plugin import Server, ServerOptions, serve_channel

async def main():
    server = Server(ServerOptions(model_repositories=[sys.argv[1]], model_control_mode="explicit",
                                  load_models=[sys.argv[2]], allow_http=False, allow_grpc=False, allow_metrics=False))
    await server.start()
    listener = await serve_channel(server.dataplane, "127.0.0.1", 0)
    print(listener.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""
START_TIMEOUT_S = 120


class Replica:
    def __init__(self, repository: Path, model: str = "add_sub") -> None:
        self.process = subprocess.Popen([sys.executable, "-c", REPLICA, str(repository), model],
                                        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
                                        text=True)

    def address(self) -> str:
        line = self.process.stdout.readline()  # type: ignore[union-attr]  # bounded: the test's timeout below
        assert line.strip().isdigit(), f"the replica exited before serving ({self.process.poll()})"
        return f"127.0.0.1:{line.strip()}"

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # the model owner and its backend's worker processes
        self.process.wait(30)
        self.process.stdout.close()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def replicas(example_repository: Path) -> Iterator[list[tuple[Replica, str]]]:
    """Two model owners of add_sub, each a replica at its own address."""
    started = [Replica(example_repository), Replica(example_repository)]
    try:
        addresses = [asyncio.run(asyncio.wait_for(asyncio.to_thread(replica.address), START_TIMEOUT_S))
                     for replica in started]
        yield list(zip(started, addresses))
    finally:
        for replica in started:
            replica.kill()


def add_sub_request(number: int) -> tuple[InferenceRequest, np.ndarray]:
    a = np.full((1, 16), number, dtype=np.int32)
    request = InferenceRequest("add_sub", id=str(number), inputs={
        name: Tensor(name, "INT32", (1, 16), a) for name in ("INPUT0", "INPUT1")})
    return request, a + a


async def started(models: list[str], table: dict[str, list[str]]) -> ChannelDataPlane:
    async def read() -> dict[str, list[str]]:
        return table
    dataplane = ChannelDataPlane(models, "triton", read)
    await dataplane.start()
    listed = [address for addresses in table.values() for address in addresses]
    for _ in range(200):  # the links connect in the background
        if all(address in dataplane._replicas and dataplane._replicas[address].alive for address in listed):
            return dataplane
        await asyncio.sleep(0.05)
    raise AssertionError(f"could not connect to {listed}")


def test_ready_only_when_every_model_has_a_ready_replica(replicas: list[tuple[Replica, str]]) -> None:
    (_, first), (_, second) = replicas

    async def check() -> None:
        table = {"add_sub": [first, second]}
        dataplane = await started(["add_sub", "identity_bytes"], table)
        try:
            assert await dataplane.model_ready("add_sub") and not await dataplane.model_ready("identity_bytes")
            assert not await dataplane.server_ready()  # identity_bytes has no replica
            index = [(entry["name"], entry["state"]) for entry in await dataplane.repository_index()]
            assert index == [("add_sub", "READY"), ("identity_bytes", "UNAVAILABLE")]
        finally:
            dataplane.stop()
        dataplane = await started(["add_sub"], table)
        try:
            assert await dataplane.server_ready()
            table["add_sub"] = []
            await dataplane.refresh()
            assert not await dataplane.server_ready() and not await dataplane.model_ready("add_sub")
        finally:
            dataplane.stop()
    asyncio.run(asyncio.wait_for(check(), 60))


def test_no_live_replica_is_a_clear_unavailable(replicas: list[tuple[Replica, str]],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routing, "REPLICA_WAIT_S", 0.5)

    async def check() -> None:
        dataplane = await started(["add_sub"], {"add_sub": []})
        try:
            request, _ = add_sub_request(1)
            with pytest.raises(ServerError, match="model 'add_sub' is unavailable: no live replica") as error:
                await infer_one(dataplane, request, "")
            assert error.value.status is Status.UNAVAILABLE
        finally:
            dataplane.stop()
    asyncio.run(asyncio.wait_for(check(), 60))


def test_one_request_at_a_time_goes_to_each_replica_in_turn_and_statistics_sum_them(
        replicas: list[tuple[Replica, str]]) -> None:
    addresses = [address for _, address in replicas]

    async def successes(dataplane: ChannelDataPlane) -> list[int]:
        counts = []
        for address in addresses:
            stats = await dataplane._replicas[address].link.forward("model_statistics",
                                                                    {"name": "add_sub", "version": None})
            counts.append(stats[0]["inference_stats"]["success"]["count"])
        return counts

    async def run() -> list[int]:
        dataplane = await started(["add_sub"], {"add_sub": addresses})
        try:
            before = await successes(dataplane)
            for number in range(4):
                request, _ = add_sub_request(number)
                await infer_one(dataplane, request, "")
            after = await successes(dataplane)
            # The front door's statistics are the replicas' summed: by name, and among every model's.
            for entries in (await dataplane.model_statistics("add_sub"), await dataplane.model_statistics()):
                assert [(entry["name"], entry["version"]) for entry in entries] == [("add_sub", "1")]
                assert entries[0]["inference_stats"]["success"]["count"] == sum(after)
                assert entries[0]["inference_count"] == sum(after)
            return [now - first for now, first in zip(after, before)]
        finally:
            dataplane.stop()
    assert asyncio.run(asyncio.wait_for(run(), 60)) == [2, 2]


def test_a_replica_killed_under_load_loses_no_request(replicas: list[tuple[Replica, str]]) -> None:
    """Eight clients send 400 requests in all over two replicas; one is killed after 100 are answered: every
    request is answered (the killed replica's are sent to the other), none is lost or left waiting."""
    (victim, first), (_, second) = replicas
    total, workers = 400, 8
    outcomes: Counter[str] = Counter()

    async def client(dataplane: ChannelDataPlane, numbers: range) -> None:
        for number in numbers:
            request, expected = add_sub_request(number)
            try:
                response = await asyncio.wait_for(infer_one(dataplane, request, ""), 30)
            except asyncio.TimeoutError:
                outcomes["hung"] += 1
            except ServerError as error:
                outcomes[f"error {error.status.name}"] += 1
            else:
                outcomes["ok" if np.array_equal(response.outputs[0].data, expected) else "wrong"] += 1

    async def killer() -> None:
        while sum(outcomes.values()) < total // 4:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(victim.kill)

    async def run() -> None:
        dataplane = await started(["add_sub"], {"add_sub": [first, second]})
        try:
            share = total // workers
            await asyncio.gather(killer(), *(client(dataplane, range(n * share, (n + 1) * share))
                                             for n in range(workers)))
        finally:
            dataplane.stop()
    asyncio.run(asyncio.wait_for(run(), 180))
    assert outcomes == Counter(ok=total), outcomes


# A decoupled model that sends one response, then waits (the test kills its replica meanwhile).
HALTING_STREAM = {
    "config.pbtxt": """
name: "halting_stream"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
""",
    "1/model.py": """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], np.int32))]))
            time.sleep(120)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
""",
}


def test_a_stream_whose_replica_goes_away_ends_naming_it(tmp_path: Path) -> None:
    """A stream that has had a response when its replica goes away is not sent to another replica (its client
    has part of it): it ends UNAVAILABLE, saying that replica went away, not that the server is shutting down."""
    for name, text in HALTING_STREAM.items():
        (tmp_path / "halting_stream" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "halting_stream" / name).write_text(text)
    replica = Replica(tmp_path, "halting_stream")

    async def run() -> list[tuple[InferenceResponse | None, bool]]:
        address = await asyncio.wait_for(asyncio.to_thread(replica.address), START_TIMEOUT_S)
        dataplane = await started(["halting_stream"], {"halting_stream": [address]})
        try:
            request = InferenceRequest("halting_stream", inputs={
                "IN": Tensor("IN", "INT32", (1,), np.array([1], np.int32))})
            dataplane.submit(request)
            stream = request.responses()
            answers = [await asyncio.wait_for(anext(stream), 60)]
            await asyncio.to_thread(replica.kill)
            answers.append(await asyncio.wait_for(anext(stream), 30))
            return answers
        finally:
            dataplane.stop()
    try:
        (first, first_final), (last, last_final) = asyncio.run(run())
    finally:
        replica.kill()
    assert first is not None and first.error is None and not first_final
    assert first.outputs[0].data.tolist() == [7]
    assert last is not None and last_final and last.error is not None
    assert last.error.status is Status.UNAVAILABLE
    assert last.error.message.startswith("the replica at 127.0.0.1:") and "went away during the request" in \
        last.error.message, last.error.message


def duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


def replica_stats(scale: int, last: int, batch_sizes: list[int],
                  memory: list[tuple[str, int, int]]) -> dict[str, object]:
    """A Triton ``model_stats`` entry of add_sub version 1 whose counts are multiples of ``scale``."""
    return {
        "name": "add_sub", "version": "1", "last_inference": last, "inference_count": 3 * scale,
        "execution_count": 2 * scale,
        "inference_stats": {"success": duration(3 * scale, 300 * scale), "fail": duration(scale, 10 * scale),
                            "queue": duration(3 * scale, 30 * scale)},
        "response_stats": {"0": {"success": duration(scale, 5 * scale), "empty_response": duration(0, 0)}},
        "batch_stats": [{"batch_size": size, "compute_infer": duration(scale, 7 * scale)} for size in batch_sizes],
        "memory_usage": [{"type": kind, "id": device, "byte_size": size} for kind, device, size in memory],
    }


def test_statistics_entries_are_summed_field_by_field() -> None:
    first = replica_stats(1, 1000, [1, 2], [("CPU", 0, 64), ("GPU", 0, 512)])
    second = replica_stats(10, 900, [2, 4], [("GPU", 0, 1024), ("GPU", 1, 256)])
    other = {**replica_stats(5, 950, [], []), "version": "2"}
    assert summed([[first], [second, other]]) == [{
        "name": "add_sub", "version": "1", "last_inference": 1000, "inference_count": 33, "execution_count": 22,
        "inference_stats": {"success": duration(33, 3300), "fail": duration(11, 110), "queue": duration(33, 330)},
        "response_stats": {"0": {"success": duration(11, 55), "empty_response": duration(0, 0)}},
        "batch_stats": [{"batch_size": 1, "compute_infer": duration(1, 7)},
                        {"batch_size": 2, "compute_infer": duration(11, 77)},
                        {"batch_size": 4, "compute_infer": duration(10, 70)}],
        "memory_usage": [{"type": "CPU", "id": 0, "byte_size": 64}, {"type": "GPU", "id": 0, "byte_size": 1536},
                         {"type": "GPU", "id": 1, "byte_size": 256}],
    }, other]


def test_calls_one_replica_cannot_answer_for_the_deployment_are_refused() -> None:
    async def table() -> dict[str, list[str]]:
        return {}

    async def refusal(call: str) -> ServerError:
        with pytest.raises(ServerError) as refused:
            await getattr(ChannelDataPlane(["add_sub"], "triton", table), call)()
        return refused.value

    metrics = asyncio.run(refusal("metrics_text"))  # each replica's metrics are its own server's
    assert metrics.status is Status.UNSUPPORTED and "not supported through Ray Serve" in str(metrics)
    logging = asyncio.run(refusal("log_settings"))
    assert logging.status is Status.UNSUPPORTED and "the logging extension" in str(logging)
