"""Batches on their way to a worker while it runs another: small batches travel inside the frames and wait in the
worker's socket (up to eight per instance), larger ones go through the arenas alone; every datatype arrives intact
either way, answers keep their requests, and statistics count the worker's own execute time as inference."""
from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

SLOW = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""
SLOW_CONFIG = """
max_batch_size: 0
input { name: "X" data_type: TYPE_INT32 dims: [ 1 ] }
output { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }
instance_group { kind: KIND_CPU count: 1 }
"""
IDENTITY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for name in ("BYTES", "FP16", "FP64"):
                array = pb_utils.get_input_tensor_by_name(request, "IN_" + name).as_numpy()
                outputs.append(pb_utils.Tensor("OUT_" + name, array))
            grow = int(pb_utils.get_input_tensor_by_name(request, "GROW").as_numpy()[0])
            outputs.append(pb_utils.Tensor("BIG", np.arange(grow, dtype=np.int64)))  # outputs larger than inputs
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""
IDENTITY_CONFIG = """
max_batch_size: 0
input [ { name: "IN_BYTES" data_type: TYPE_STRING dims: [ -1 ] },
        { name: "IN_FP16" data_type: TYPE_FP16 dims: [ -1 ] },
        { name: "IN_FP64" data_type: TYPE_FP64 dims: [ -1, -1 ] },
        { name: "GROW" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUT_BYTES" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "OUT_FP16" data_type: TYPE_FP16 dims: [ -1 ] },
         { name: "OUT_FP64" data_type: TYPE_FP64 dims: [ -1, -1 ] },
         { name: "BIG" data_type: TYPE_INT64 dims: [ -1 ] } ]
instance_group { kind: KIND_CPU count: 1 }
"""


@pytest.fixture
def server(kit: Any, tmp_path: Path, python_server: Any) -> Any:
    repo = tmp_path / "models"
    kit.write_model(repo, "slow", SLOW, SLOW_CONFIG)
    kit.write_model(repo, "identity", IDENTITY, IDENTITY_CONFIG)
    return python_server(repo)


def _slow(client: grpcclient.InferenceServerClient, value: int) -> int:
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([value], dtype=np.int32))
    return int(client.infer("slow", [x]).as_numpy("Y")[0])


def test_a_second_batch_waits_in_the_worker_not_in_the_queue(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda v: _slow(client, v), [3, 4])) == [3, 4]
    stats = client.get_inference_statistics("slow", as_json=True)["model_stats"][0]
    inference = stats["inference_stats"]
    assert int(stats["execution_count"]) == 2 and int(inference["success"]["count"]) == 2
    # Both batches left the queue at once (one instance, two in flight)...
    assert int(inference["queue"]["ns"]) < 0.15e9
    # ...the worker ran them one after the other, 0.3 s each by its own clock...
    assert 0.55e9 < int(inference["compute_infer"]["ns"]) < 3e9
    # ...and the second one's wait in the worker counts before its inference, not in it.
    assert int(inference["compute_input"]["ns"]) > 0.2e9


def _identity_inputs(rng: np.random.Generator, size: int, grow: int) -> tuple[list[grpcclient.InferInput], dict[str, Any]]:
    arrays = {
        "IN_BYTES": np.array([bytes(rng.integers(0, 256, rng.integers(0, 9), dtype=np.uint8)) for _ in range(size)],
                             dtype=np.object_),
        "IN_FP16": rng.random(size).astype(np.float16),
        "IN_FP64": rng.random((size, 3)) if size else np.zeros((0, 3)),
        "GROW": np.array([grow], dtype=np.int64),
    }
    inputs = []
    for name, array in arrays.items():
        datatype = {"IN_BYTES": "BYTES", "IN_FP16": "FP16", "IN_FP64": "FP64", "GROW": "INT64"}[name]
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs, arrays


@pytest.mark.parametrize("size, grow", [(0, 0), (3, 5), (20_000, 10), (2, 200_000)],
                         ids=["zero-sized", "small", "inputs-through-the-arena", "outputs-larger-than-inline"])
def test_every_datatype_arrives_intact_whichever_way_it_travels(server: Any, size: int, grow: int) -> None:
    """Sizes on both sides of the inline limit, sent concurrently, so inline and arena batches mix."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    rng = np.random.default_rng(size + grow)

    def one(seed: int) -> None:
        inputs, arrays = _identity_inputs(np.random.default_rng(seed), size if seed % 2 else 3, grow)
        result = client.infer("identity", inputs)
        assert list(result.as_numpy("OUT_BYTES")) == list(arrays["IN_BYTES"])
        np.testing.assert_array_equal(result.as_numpy("OUT_FP16"), arrays["IN_FP16"])
        np.testing.assert_array_equal(result.as_numpy("OUT_FP64"), arrays["IN_FP64"])
        np.testing.assert_array_equal(result.as_numpy("BIG"), np.arange(grow, dtype=np.int64))

    seeds = [int(s) for s in rng.integers(0, 1 << 30, 8)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(one, seed) for seed in seeds]:
            future.result(timeout=120)


GATED = """
import os, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.path.join(args["model_repository"], "gate")

    def execute(self, requests):
        open(self.gate + ".running", "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(self.gate + ".open") and time.monotonic() < deadline:
            time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def _one_batch_then_two_overlapping(kit: Any, tmp_path: Path, python_server: Any, options: dict[str, str],
                                    executes: list[Any]) -> None:
    """Serve the gated model; send one batch alone, then a second while the first is held at the gate.
    ``executes`` is filled by the test with one entry per EXECUTE frame the server sends."""
    repo = tmp_path / "models"
    model_dir = kit.write_model(repo, "gated", GATED, SLOW_CONFIG)
    opened, running = model_dir / "gate.open", model_dir / "gate.running"  # see GATED
    opened.touch()
    server = python_server(repo, backend_config={"python": options})
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    assert int(client.infer("gated", [x]).as_numpy("Y")[0]) == 1
    assert len(executes) == 1

    opened.unlink()
    running.unlink()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.infer, "gated", [x])
        kit.wait_until(running.exists, "the first batch to be held at the gate")
        second = pool.submit(client.infer, "gated", [x])
        kit.wait_until(lambda: len(executes) == 3, "the second batch to be sent")
        opened.touch()
        assert [int(f.result(timeout=60).as_numpy("Y")[0]) for f in (first, second)] == [1, 1]


def test_a_batch_sent_alone_asks_for_busy_polling_and_one_sent_behind_another_does_not(
        kit: Any, tmp_path: Path, python_server: Any, shm_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import triton_serve_python.process as process

    polls: list[float] = []  # each EXECUTE frame's busy-poll hint, in the order the server sent them
    encode = process.encode

    def recording_encode(kind: Any, body: Any = None) -> bytes:
        if kind == process.Kind.EXECUTE:
            polls.append(body[4])
        return encode(kind, body)

    monkeypatch.setattr(process, "encode", recording_encode)
    _one_batch_then_two_overlapping(kit, tmp_path, python_server, {"shm-region-prefix-name": shm_prefix,
                                                                   "busy-poll-microseconds": "700"}, polls)
    assert polls[0] == 700e-6  # nothing else on its way: the server and the worker poll
    assert polls[1:] == [700e-6, 0.0]  # the second went while the first was owed: no polling for it


def test_a_batch_for_a_worker_that_owes_nothing_leaves_at_once_and_one_behind_another_at_the_end_of_the_turn(
        kit: Any, tmp_path: Path, python_server: Any, shm_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone batch is written inside ``_send``, before the event loop turns (a dynamic batcher's next batch
    then reaches the worker while the last batch's responses are written); a batch sent while another is owed
    waits for the end of the turn, to leave in one write with whatever else that turn sends."""
    import triton_serve_python.process as process

    at_once: list[bool] = []  # for each EXECUTE frame: written before _send returned
    send = process.WorkerProcess._send

    def recording_send(self: Any, frame: bytes) -> None:
        send(self, frame)
        if process.FrameDecoder().feed(frame)[0][0] == process.Kind.EXECUTE:
            at_once.append(not any(queued is frame for queued in self._outgoing))

    monkeypatch.setattr(process.WorkerProcess, "_send", recording_send)
    _one_batch_then_two_overlapping(kit, tmp_path, python_server, {"shm-region-prefix-name": shm_prefix}, at_once)
    assert at_once == [True, True, False]


NAPPING = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):  # sleeps X ms
        time.sleep(sum(int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0]) for r in requests) / 1000)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def test_the_server_polls_for_a_lone_batch_s_answer_only_while_answers_come_within_the_limit(
        kit: Any, tmp_path: Path, python_server: Any, shm_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each lone batch's answer is polled for by the server for four times the usual wait for such answers (within
    busy-poll-microseconds): a model that answers in 50 ms is soon not polled for, and when its answers come
    quickly again, polling resumes. The worker's hint stays the limit (it learns its own wait)."""
    import triton_serve_python.process as process

    windows: list[float] = []  # for each lone EXECUTE frame: how long the server polled for its answer
    hints: list[float] = []
    flush = process.WorkerProcess._flush

    def recording_flush(self: Any) -> None:
        kind, body = process.FrameDecoder().feed(self._outgoing[0])[0]
        if kind == process.Kind.EXECUTE:
            windows.append(self._poll_s)
            hints.append(body[4])
        flush(self)

    monkeypatch.setattr(process.WorkerProcess, "_flush", recording_flush)
    repo = tmp_path / "models"
    kit.write_model(repo, "napping", NAPPING, SLOW_CONFIG)
    server = python_server(repo, backend_config={"python": {"shm-region-prefix-name": shm_prefix,
                                                            "busy-poll-microseconds": "10000"}})
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def nap(ms: int, times: int) -> list[float]:
        x = grpcclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([ms], dtype=np.int32))
        start = len(windows)
        for _ in range(times):
            assert int(client.infer("napping", [x]).as_numpy("Y")[0]) == ms
        return windows[start:]

    assert all(window > 0 for window in nap(0, 3))  # quick answers: polled for
    assert nap(50, 8)[-1] == 0  # answers later than the 10 ms limit: soon not polled for
    assert any(window > 0 for window in nap(0, 30))  # quick again (some ms each on a loaded machine): polled for
    assert set(hints) == {10e-3}
