"""Engine sharing: one load per (plan file, GPU), freed after the last instance lets go."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from triton_serve.plugin import ServerError
from triton_serve_tensorrt.shared_engines import SharedEngines


class Recorder:
    """A loader that returns a token per load and records loads and frees."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, int]] = []
        self.freed: list[str] = []

    def load(self, plan: Path, device: int) -> str:
        self.loads.append((plan.name, device))
        return f"{plan.name}@{device}#{len(self.loads)}"

    def free(self, engine: str) -> None:
        self.freed.append(engine)


@pytest.fixture
def plan(tmp_path: Path) -> Path:
    path = tmp_path / "model.plan"
    path.write_bytes(b"engine v1")
    return path


def test_instances_on_one_gpu_share_one_load(plan: Path) -> None:
    recorder = Recorder()
    engines = SharedEngines(recorder.load, recorder.free)
    first, second = engines.acquire(plan, 0), engines.acquire(plan, 0)
    assert first.engine == second.engine == "model.plan@0#1"
    assert recorder.loads == [("model.plan", 0)]
    assert engines.users(plan, 0) == 2


def test_each_gpu_gets_its_own_engine(plan: Path) -> None:
    recorder = Recorder()
    engines = SharedEngines(recorder.load, recorder.free)
    assert engines.acquire(plan, 0).engine != engines.acquire(plan, 1).engine
    assert recorder.loads == [("model.plan", 0), ("model.plan", 1)]


def test_the_engine_is_freed_after_the_last_release_only(plan: Path) -> None:
    recorder = Recorder()
    engines = SharedEngines(recorder.load, recorder.free)
    first, second = engines.acquire(plan, 0), engines.acquire(plan, 0)
    first.release()
    first.release()  # a second release of the same lease does nothing
    assert recorder.freed == [] and engines.users(plan, 0) == 1
    second.release()
    assert recorder.freed == ["model.plan@0#1"] and engines.users(plan, 0) == 0
    assert engines.acquire(plan, 0).engine == "model.plan@0#2"


def test_a_replaced_plan_file_is_a_new_engine(plan: Path) -> None:
    recorder = Recorder()
    engines = SharedEngines(recorder.load, recorder.free)
    old = engines.acquire(plan, 0)
    plan.write_bytes(b"engine v2, rebuilt")
    stat = plan.stat()
    os.utime(plan, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    new = engines.acquire(plan, 0)
    assert (old.engine, new.engine) == ("model.plan@0#1", "model.plan@0#2")
    old.release()
    assert recorder.freed == ["model.plan@0#1"] and engines.users(plan, 0) == 1


def test_a_failed_load_leaves_nothing_behind(plan: Path) -> None:
    attempts: list[int] = []

    def failing(path: Path, device: int) -> str:
        attempts.append(device)
        raise ServerError("not an engine")

    engines: SharedEngines[str] = SharedEngines(failing)
    for _ in range(2):
        with pytest.raises(ServerError, match="not an engine"):
            engines.acquire(plan, 0)
    assert attempts == [0, 0] and engines.users(plan, 0) == 0


def test_concurrent_first_acquires_load_once(plan: Path) -> None:
    loads: list[int] = []

    def slow_load(path: Path, device: int) -> str:
        loads.append(device)
        time.sleep(0.05)
        return "engine"

    engines: SharedEngines[str] = SharedEngines(slow_load)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(engines.acquire(plan, 0).engine)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert loads == [0] and results == ["engine"] * 4 and engines.users(plan, 0) == 4
