"""PyTriton 0.7.0 against triton-serve-pytriton on the same bound function, with perf_analyzer over
HTTP and gRPC; and in-process ``infer`` calls per second against that model (see bench/README.md)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from run_add_sub import (  # noqa: E402
    LOOPBACK, REPO, RESULTS, Result, ServerFailed, add_run_arguments, check_run_arguments, fmt_latency, fmt_rate,
    fmt_ratio, free_ports, measure, running,
)

SERVER_SCRIPT = Path(__file__).parent / "pytriton_add_sub.py"
MODEL = "AddSub"
PROTOCOLS = ["http-binary", "grpc"]
SHAPES = ("--shape", "INPUT_1:16", "--shape", "INPUT_2:16")
DEFAULT_PYTRITON_PYTHON = REPO / "pytriton-venv" / "bin" / "python"


def server_command(impl: str, args: argparse.Namespace, ports: object) -> tuple[list[str], dict[str, str]]:
    python = str(args.pytriton_python) if impl == "pytriton" else sys.executable
    env = {**os.environ, "BENCH_PYTRITON_IMPL": impl}
    for name in ("http", "grpc", "metrics"):
        env[f"PYTRITON_TRITON_CONFIG_{name.upper()}_PORT"] = str(getattr(ports, name))
        env[f"PYTRITON_TRITON_CONFIG_{name.upper()}_ADDRESS"] = LOOPBACK
    return [python, str(SERVER_SCRIPT)], env


def bench_server(impl: str, args: argparse.Namespace, stem: str) -> list[Result]:
    ports = free_ports()
    command, env = server_command(impl, args, ports)
    base = f"http://{LOOPBACK}:{ports.http}/v2"
    log_path = RESULTS / f"{stem}-{impl}.log"
    args.model = MODEL
    args.variant = "plain"
    print(f"{impl}: {' '.join(command)}", flush=True)
    results = []
    try:
        with running(command, env, [f"{base}/health/live", f"{base}/models/{MODEL}/ready"], args.start_timeout,
                     log_path):
            for protocol in args.protocols:
                for concurrency in args.concurrency:
                    csv_path = RESULTS / f"{stem}-{impl}-{protocol}-c{concurrency}.csv"
                    result = measure(impl, protocol, concurrency, ports, args, csv_path, SHAPES)
                    print(f"  {protocol:12} c={concurrency:<3} {fmt_rate(result):>10} infer/s  {fmt_latency(result)}",
                          flush=True)
                    results.append(result)
    except ServerFailed as error:
        results = [Result(impl, "plain", p, c, "error", detail=str(error))
                   for p in args.protocols for c in args.concurrency]
    return results


def in_process(args: argparse.Namespace) -> list[Result]:
    """``triton.server.model(...).infer`` in this process, from 1 and from 16 threads, for ``--inprocess-seconds``."""
    os.environ.pop("BENCH_PYTRITON_IMPL", None)
    import pytriton_add_sub
    from triton_serve_pytriton.triton import Triton, TritonConfig

    ports = free_ports()
    results = []
    config = TritonConfig(http_address=LOOPBACK, http_port=ports.http, allow_grpc=False, allow_metrics=False)
    with Triton(config=config) as triton:
        pytriton_add_sub.bind(triton)
        model = triton.server.model(MODEL)
        row = np.arange(16, dtype=np.float32).reshape(1, 16)
        inputs = {"INPUT_1": row, "INPUT_2": row}
        for concurrency in args.concurrency:
            counts = [0] * concurrency
            latencies: list[list[float]] = [[] for _ in range(concurrency)]
            stop = threading.Event()

            def loop(index: int) -> None:
                while not stop.is_set():
                    began = time.perf_counter()
                    model.infer(inputs)
                    latencies[index].append(time.perf_counter() - began)
                    counts[index] += 1

            threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
            for thread in threads:
                thread.start()
            time.sleep(args.inprocess_seconds)
            stop.set()
            for thread in threads:
                thread.join(30)
            every = sorted(latency for each in latencies for latency in each)
            result = Result("in-process", "plain", "in-process", concurrency, "ok",
                            infer_per_sec=sum(counts) / args.inprocess_seconds,
                            p50_us=int(statistics.median(every) * 1e6) if every else None,
                            p99_us=int(every[int(len(every) * 0.99)] * 1e6) if every else None)
            print(f"  in-process   c={concurrency:<3} {fmt_rate(result):>10} infer/s  {fmt_latency(result)}", flush=True)
            results.append(result)
    return results


def find(results: list[Result], server: str, protocol: str, concurrency: int) -> Result | None:
    return next((r for r in results if (r.server, r.protocol, r.concurrency) == (server, protocol, concurrency)), None)


def markdown(results: list[Result], args: argparse.Namespace, header: str) -> str:
    lines = [header, "", "| protocol | c | triton-serve infer/s | PyTriton 0.7.0 infer/s | ours/PyTriton |",
             "|---|---|---|---|---|"]
    for protocol in args.protocols:
        for concurrency in args.concurrency:
            ours, theirs = find(results, "ours", protocol, concurrency), find(results, "pytriton", protocol, concurrency)
            lines.append(f"| {protocol} | {concurrency} | {fmt_rate(ours)} | {fmt_rate(theirs)} | {fmt_ratio(ours, theirs)} |")
    lines += ["", "| c | in-process infer/s | HTTP (ours) infer/s | in-process/HTTP |", "|---|---|---|---|"]
    for concurrency in args.concurrency:
        inside, http = find(results, "in-process", "in-process", concurrency), find(results, "ours", "http-binary",
                                                                                     concurrency)
        lines.append(f"| {concurrency} | {fmt_rate(inside)} | {fmt_rate(http)} | {fmt_ratio(inside, http)} |")
    failed = [r for r in results if r.status == "error"]
    lines += [""] + [f"- {r.server} {r.protocol} c={r.concurrency}: {r.detail}" for r in failed]
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=PROTOCOLS)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--pytriton-python", type=Path, default=DEFAULT_PYTRITON_PYTHON,
                        help="an interpreter with nvidia-pytriton==0.7.0 installed")
    parser.add_argument("--skip", nargs="*", choices=["pytriton", "ours", "in-process"], default=[],
                        help="parts not to run (a smoke check: --skip pytriton ours)")
    parser.add_argument("--inprocess-seconds", type=float, default=10.0)
    add_run_arguments(parser)
    args = parser.parse_args()
    if "ours" not in args.skip or "pytriton" not in args.skip:
        check_run_arguments(parser, args)
    if "pytriton" not in args.skip and not args.pytriton_python.exists():
        parser.error(f"{args.pytriton_python} does not exist: python3 -m venv pytriton-venv && "
                     "pytriton-venv/bin/pip install nvidia-pytriton==0.7.0 (or --skip pytriton)")
    return args


def main() -> int:
    args = parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = datetime.now()
    stem = f"pytriton-{started:%Y%m%d-%H%M%S}"
    results: list[Result] = []
    for impl in ("ours", "pytriton"):
        if impl not in args.skip:
            results += bench_server(impl, args, stem)
    if "in-process" not in args.skip:
        results += in_process(args)
    header = (f"## PyTriton 0.7.0 vs triton-serve-pytriton, {MODEL} FP32[16], {started:%Y-%m-%d %H:%M}, "
              f"{os.cpu_count()} CPUs, {platform.platform()}")
    table = markdown(results, args, header)
    (RESULTS / f"{stem}.md").write_text(table)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    (RESULTS / f"{stem}.json").write_text(json.dumps({"started": started.isoformat(timespec="seconds"),
                                                      "settings": settings, "results": [asdict(r) for r in results]},
                                                     indent=2) + "\n")
    print("\n" + table + f"\nwritten: {RESULTS / stem}.md and .json")
    return 0 if all(r.status != "error" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
