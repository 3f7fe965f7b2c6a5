"""The ensemble's overhead: one request through a 3-step ensemble of trivial Python models, against a client
that calls the three models one after another (see bench/README.md)."""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from run_add_sub import (LOOPBACK, RESULTS, SERVERS, Ports, Result, ServerFailed, add_run_arguments,
                         check_run_arguments, fmt_rate, free_ports, measure, running, server_flags, start_run)

STEPS = ("step_a", "step_b", "step_c")
ENSEMBLE = "chain3"
STEP_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 16 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 16 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""
STEP_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + 1)]) for r in requests]
'''


def ensemble_config() -> str:
    tensors = ["IN", "t1", "t2", "OUT"]
    steps = ", ".join(
        f'{{ model_name: "{name}" model_version: -1 input_map {{ key: "IN" value: "{tensors[i]}" }} '
        f'output_map {{ key: "OUT" value: "{tensors[i + 1]}" }} }}' for i, name in enumerate(STEPS))
    return (f'name: "{ENSEMBLE}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
            'input [ { name: "IN", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
            'output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
            f"ensemble_scheduling {{ step [ {steps} ] }}\n")


def write_repository(root: Path) -> Path:
    """Three Python models (OUT = IN + 1) and the ensemble that chains them."""
    for name in STEPS:
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(STEP_CONFIG.format(name=name))
        (root / name / "1" / "model.py").write_text(STEP_MODEL)
    (root / ENSEMBLE / "1").mkdir(parents=True)
    (root / ENSEMBLE / "config.pbtxt").write_text(ensemble_config())
    return root


@dataclass
class LoopResult:
    """Requests per second and client latencies of one closed-loop client run."""

    server: str
    mode: str  # "ensemble" (one request) or "sequential" (three requests, one after another)
    concurrency: int
    chains_per_sec: float
    p50_us: int
    p99_us: int


def chain_latencies(port: int, mode: str, stop_at: float, results: multiprocessing.Queue[list[int]]) -> None:
    """One client process: run chains until ``stop_at`` (monotonic), then put their latencies in µs."""
    client = httpclient.InferenceServerClient(f"{LOOPBACK}:{port}")
    tensor = httpclient.InferInput("IN", [1, 16], "FP32")
    models = [ENSEMBLE] if mode == "ensemble" else list(STEPS)
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    latencies = []
    while time.monotonic() < stop_at:
        started = time.perf_counter_ns()
        values = data
        for model in models:
            tensor.set_data_from_numpy(values)
            values = client.infer(model, [tensor]).as_numpy("OUT")
        if values[0, 0] != 3.0:
            raise RuntimeError(f"chain answered {values[0, 0]}, expected 3")
        latencies.append((time.perf_counter_ns() - started) // 1000)
    client.close()
    results.put(latencies)


def client_loop(ports: Ports, mode: str, concurrency: int, seconds: float) -> tuple[float, int, int]:
    """``concurrency`` client processes (no shared GIL), each with its own HTTP connection, run chains
    for ``seconds``; returns chains/s and the p50 / p99 latency of a chain in µs."""
    context = multiprocessing.get_context("fork")
    results: multiprocessing.Queue[list[int]] = context.Queue()
    stop_at = time.monotonic() + seconds
    workers = [context.Process(target=chain_latencies, args=(ports.http, mode, stop_at, results))
               for _ in range(concurrency)]
    for worker in workers:
        worker.start()
    everything = sorted(v for _ in workers for v in results.get(timeout=seconds + 60))
    for worker in workers:
        worker.join()
    quantiles = statistics.quantiles(everything, n=100)
    return len(everything) / seconds, int(quantiles[49]), int(quantiles[98])


def bench_server(server: str, args: argparse.Namespace, stem: str,
                 repository: Path) -> tuple[list[LoopResult], list[Result]]:
    ports = free_ports()
    command, env = SERVERS[server](server_flags(repository, ENSEMBLE, ports))
    base = f"http://{LOOPBACK}:{ports.http}/v2"
    urls = [f"{base}/health/ready", f"{base}/models/{ENSEMBLE}/ready"]
    print(f"{server}: {' '.join(command)}", flush=True)
    loops: list[LoopResult] = []
    analyzed: list[Result] = []
    try:
        with running(command, env, urls, args.start_timeout, RESULTS / f"{stem}-{server}.log"):
            client_loop(ports, "sequential", 1, 1.0)  # warm every model and connection path
            for concurrency in args.concurrency:
                for mode in ("ensemble", "sequential"):
                    rate, p50, p99 = client_loop(ports, mode, concurrency, args.seconds)
                    loops.append(LoopResult(server, mode, concurrency, rate, p50, p99))
                    print(f"  client loop {mode} c={concurrency}: {rate:,.0f} chains/s, p50 {p50:,} µs", flush=True)
                result = measure(server, "http-binary", concurrency, ports, args, RESULTS / f"{stem}-last.csv")
                print(f"  perf_analyzer {ENSEMBLE} c={concurrency}: {fmt_rate(result)} {result.detail}", flush=True)
                analyzed.append(result)
    except ServerFailed as error:
        print(f"  {server} failed: {error}", file=sys.stderr)
    (RESULTS / f"{stem}-last.csv").unlink(missing_ok=True)
    return loops, analyzed


def markdown(loops: list[LoopResult], analyzed: list[Result], header: str) -> str:
    by_key = {(r.server, r.mode, r.concurrency): r for r in loops}
    lines = [header, "", "| server | c | ensemble chains/s | sequential chains/s | ensemble / sequential | "
             "ensemble p50 (µs) | sequential p50 (µs) | perf_analyzer ensemble infer/s |", "|" + "---|" * 8]
    for result in analyzed:
        ensemble = by_key.get((result.server, "ensemble", result.concurrency))
        sequential = by_key.get((result.server, "sequential", result.concurrency))
        if ensemble is None or sequential is None:
            continue
        lines.append(f"| {result.server} | {result.concurrency} | {ensemble.chains_per_sec:,.0f} | "
                     f"{sequential.chains_per_sec:,.0f} | {ensemble.chains_per_sec / sequential.chains_per_sec:.2f} | "
                     f"{ensemble.p50_us:,} | {sequential.p50_us:,} | {fmt_rate(result)} |")
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each client-loop run")
    add_run_arguments(parser)
    args = parser.parse_args()
    check_run_arguments(parser, args)
    args.model, args.variant = ENSEMBLE, "plain"  # what run_add_sub.measure reads
    return args


def main() -> int:
    args = parse_args()
    servers = start_run(args)
    started = datetime.now()
    stem = f"ensemble-{started:%Y%m%d-%H%M%S}"
    loops: list[LoopResult] = []
    analyzed: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="bench-ensemble-") as scratch:
        repository = write_repository(Path(scratch))
        for server in servers:
            server_loops, server_analyzed = bench_server(server, args, stem, repository)
            loops += server_loops
            analyzed += server_analyzed
    header = (f"## 3-step ensemble vs 3 sequential calls, {started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, "
              f"{platform.platform()}\n\nClient loop: tritonclient.http, one process and connection per concurrent "
              f"chain, {args.seconds:g} s per row; perf_analyzer: HTTP binary, {args.measurement_interval} ms windows.")
    table = markdown(loops, analyzed, header)
    (RESULTS / f"{stem}.md").write_text(table)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"started": started.isoformat(timespec="seconds"), "cpus": os.cpu_count(), "machine": platform.platform(),
         "loops": [asdict(r) for r in loops], "perf_analyzer": [asdict(r) for r in analyzed]}, indent=2) + "\n")
    print("\n" + table + f"\nwritten: {RESULTS / stem}.md and .json")
    return 0 if loops and all(r.status != "error" for r in analyzed) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
