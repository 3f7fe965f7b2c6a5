"""What a scheduler costs the process that owns the models, per request, with nothing else in the way.

Runs the default scheduler and the dynamic batcher in one process over an instance that answers one event-loop
turn after it is called (no worker, no front end), with ``--concurrency`` clients that each send the next request
when the last one is answered, and prints the process's CPU time per request. The requests of one turn batch
together, so concurrency N gives the dynamic batcher batches of N and the default scheduler N single requests.

    .venv/bin/python bench/scheduler_cost.py --concurrency 1 2 4
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import uvloop
from google.protobuf import text_format

from triton_serve._engine.builtins.passthrough import PassThroughScheduler
from triton_serve.plugin import (InferenceClient, InferenceRequest, InferenceResponse, InstancePool, ModelConfig,
                                 ModelContext, ModelInstance, ModelSpec, Scheduler, Tensor)
from triton_serve.testing import probe_config
from triton_serve_batching.dynamic import DynamicBatcher

SCHEDULERS: dict[str, tuple[type[Scheduler], str]] = {
    "default": (PassThroughScheduler, ""),
    "dynamic_batching": (DynamicBatcher, "dynamic_batching { }"),
}


class NextTurnInstance(ModelInstance):
    """Answers each batch one event-loop turn after it is called, as a worker's answer would come later;
    takes as many batches at once as a Python model's worker."""

    max_batches_in_flight = 8

    def __init__(self) -> None:
        self.batch_sizes: collections.Counter[int] = collections.Counter()

    async def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse]:
        self.batch_sizes[len(requests)] += 1
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(answered.set_result, None)
        await answered
        return [InferenceResponse() for _ in requests]


async def cpu_per_request(kind: str, concurrency: int, count: int) -> tuple[float, NextTurnInstance]:
    scheduler_type, extra_config = SCHEDULERS[kind]
    config = text_format.Parse(probe_config(max_batch_size=16) + extra_config, ModelConfig(name="probe"))
    spec = ModelSpec("probe", 1, config, Path("."), Path("1"))
    instance = NextTurnInstance()
    pool = InstancePool(spec, [instance])
    scheduler = scheduler_type(ModelContext(spec, pool, pool.stats, InferenceClient()))
    await scheduler.start()
    data = np.zeros((1, 1), np.float32)
    left = count

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            request = InferenceRequest("probe", 1, inputs={"INPUT0": Tensor("INPUT0", "FP32", (1, 1), data)})
            request.enqueued_ns = time.monotonic_ns()
            scheduler.enqueue(request)
            await request.single_response()

    started = time.process_time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    spent = time.process_time() - started
    await scheduler.stop()
    return spent / count, instance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--requests", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=3, help="the best of this many runs is printed")
    args = parser.parse_args()
    print("| scheduler | concurrency | batch sizes | µs of CPU per request (best of %d) |" % args.rounds)
    print("|---|---|---|---|")
    for concurrency in args.concurrency:
        for kind in SCHEDULERS:
            runs = [uvloop.run(cpu_per_request(kind, concurrency, args.requests)) for _ in range(args.rounds)]
            best, instance = min(runs, key=lambda run: run[0])
            sizes = ", ".join(f"{size}×{n:,}" for size, n in instance.batch_sizes.most_common(2))
            print(f"| {kind} | {concurrency} | {sizes} | {best * 1e6:.1f} |")


if __name__ == "__main__":
    main()
