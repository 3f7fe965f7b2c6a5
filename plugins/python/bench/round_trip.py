"""Microseconds per ``WorkerProcess.execute`` round trip of one tiny add_sub request (two INT32 [1, 16] inputs).

    python3 plugins/python/bench/round_trip.py [--calls 2000] [--rounds 5] [--execute-timeout 0]

It prints the wall time per call, and the CPU time per call of the server and of the worker (Linux: /proc),
which a busy machine disturbs less than the wall time. ``taskset -c 3 python3 ...`` keeps both processes on one
core, which takes the cost of waking the other core out of the figures and makes them steadier.

It runs the plugin that Python imports; to measure another copy (say the last commit's, from
``git archive HEAD plugins/python | tar -x -C /tmp/before``), put it first: ``PYTHONPATH=/tmp/before/plugins/python``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import numpy as np

from triton_serve.plugin import InferenceRequest, Tensor
from triton_serve.testing import EXAMPLE_REPOSITORY
from triton_serve_python.options import PythonBackendOptions
from triton_serve_python.process import WorkerProcess

ADD_SUB = EXAMPLE_REPOSITORY / "add_sub"


def init_message() -> dict[str, object]:
    """What the instance sends to initialize add_sub (its ``initialize`` reads only the outputs' datatypes)."""
    outputs = [{"name": name, "data_type": "TYPE_INT32", "dims": [16]} for name in ("OUTPUT0", "OUTPUT1")]
    return {
        "model_file": str(ADD_SUB / "1" / "model.py"),
        "outputs": ["OUTPUT0", "OUTPUT1"],
        "decoupled": False,
        "args": {"model_config": json.dumps({"name": "add_sub", "output": outputs}), "model_instance_kind": "CPU",
                 "model_instance_name": "add_sub_0_0", "model_instance_device_id": "0",
                 "model_repository": str(ADD_SUB), "model_version": "1", "model_name": "add_sub"},
    }


def add_sub_request() -> InferenceRequest:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    return InferenceRequest("add_sub", 1, id="bench", inputs={
        name: Tensor(name, "INT32", (1, 16), data) for name in ("INPUT0", "INPUT1")})


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(calls: int, rounds: int, execute_timeout: float) -> tuple[list[float], float, float]:
    """Wall microseconds per call for each round of ``calls`` sequential executes, and the server's and the
    worker's CPU microseconds per call over all rounds."""
    options = PythonBackendOptions(execute_timeout_seconds=execute_timeout, shm_region_prefix_name="tsp_bench_")
    worker = WorkerProcess("add_sub bench", options, lambda how: print(f"worker {how}"))
    await worker.start(init_message())
    try:
        request = add_sub_request()
        for _ in range(calls // 4):  # warm-up
            await worker.execute([request])
        assert worker._process is not None
        worker_pid, per_call = worker._process.pid, []
        server_cpu, worker_cpu = time.process_time(), cpu_seconds(worker_pid)
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                responses = await worker.execute([request])
            per_call.append((time.perf_counter() - start) / calls * 1e6)
        server_cpu, worker_cpu = time.process_time() - server_cpu, cpu_seconds(worker_pid) - worker_cpu
        assert responses[0].outputs[0].data.tolist() == (2 * request.inputs["INPUT0"].data).tolist()
        return per_call, server_cpu / (calls * rounds) * 1e6, worker_cpu / (calls * rounds) * 1e6
    finally:
        await worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--execute-timeout", type=float, default=0.0, help="seconds; 0: no limit (no timer)")
    args = parser.parse_args()
    per_call, server_cpu, worker_cpu = asyncio.run(measure(args.calls, args.rounds, args.execute_timeout))
    print(f"execute round trip (execute-timeout {args.execute_timeout:g} s, {args.rounds} rounds of {args.calls}): "
          f"wall min {min(per_call):.1f} us, median {statistics.median(per_call):.1f} us; "
          f"CPU server {server_cpu:.1f} us, worker {worker_cpu:.1f} us per call")


if __name__ == "__main__":
    main()
