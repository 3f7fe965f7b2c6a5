"""Where the time of one request goes: µs of GIL-holding CPU per request, per stage, in every process.

Starts triton-serve on the example ``add_sub`` (only that model), loads it with ``perf_analyzer`` at one
concurrency and protocol, and meanwhile samples the server and all its child processes (front-end
processes, the Python-backend worker) with ``py-spy record --gil --subprocesses``. Each sample is
charged to the stage of its innermost frame that belongs to a known module; the model's inference
count before and after gives requests served, so

    µs per request in a stage = samples in the stage / sampling rate / requests * 1e6

Native time outside the GIL (grpc's C core, socket syscalls done without the GIL) is not sampled.

    .venv/bin/python bench/profile_stages.py --protocol http-binary --concurrency 16 [--ours-flags="--frontend-processes=0"]
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from run_add_sub import (LOOPBACK, PERF_ANALYZER, REPO, SCRIPTS, free_ports, running, server_flags,  # noqa: E402
                         PROTOCOLS, triton_command, with_dynamic_batching)

# (stage, markers): the first stage one of whose markers appears in a frame, innermost frame first.
STAGES = [
    ("model.py execute (worker)", ("model_repository/add_sub",)),
    ("python backend: worker side", ("triton_serve_python/worker.py", "triton_serve_python/runner.py",
                                     "triton_serve_python/pb_utils", "triton_serve_python/protocol.py")),
    ("python backend: server side", ("triton_serve_python/",)),
    ("dynamic batcher", ("triton_serve_batching/",)),
    ("instance pool, statistics", ("triton_serve/_engine/scheduling.py", "triton_serve/_engine/statistics.py",
                                   "triton_serve/_engine/ratelimit.py", "triton_serve/_engine/builtins/")),
    ("validation, output shaping", ("triton_serve/_engine/route.py",)),
    ("data plane", ("triton_serve/_engine/tracing.py", "triton_serve/_engine/shared_memory_tensors.py", "triton_serve/_engine/dataplane.py", "triton_serve/_engine/inference.py")),
    ("owner <-> front-end channel", ("triton_serve/_engine/channel.py", "triton_serve/_engine/frontend_pool.py",
                                     "triton_serve/_engine/frontend/process.py")),
    ("HTTP codec and handler", ("triton_serve/_engine/frontend/http/",)),
    ("gRPC codec and servicer", ("triton_serve/_engine/frontend/grpc/",)),
    ("HTTP server (uvicorn, httptools)", ("uvicorn/", "httptools", "h11", "hypercorn/")),
    ("gRPC library (grpc.aio)", ("grpc/", "grpc_", "protobuf")),
    ("event loop", ("asyncio/", "uvloop", "selectors.py")),
]


def stage_of(stack: str) -> str:
    stack = stack.replace("(core/", "(triton_serve/")  # an editable install runs the core from core/
    for frame in reversed([f for f in stack.split(";") if not f.startswith("process ")]):
        for stage, markers in STAGES:
            if any(marker in frame for marker in markers):
                return stage
    return "other"


class ProcessCpu(NamedTuple):
    """What /proc counts for one process: CPU seconds, context switches, and its main thread's seconds on a run
    queue waiting for a CPU (preempted, or woken while its CPU was taken)."""

    user: float
    system: float
    voluntary: int
    involuntary: int
    runnable_waiting: float


def cpu_seconds(root: int) -> dict[str, ProcessCpu]:
    """ProcessCpu of ``root`` and of each of its descendants, by 'pid name'."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[str, ProcessCpu] = {}
    parents: dict[int, int] = {}
    counts: dict[int, tuple[str, ProcessCpu]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
            status = (entry / "status").read_text()
            waiting_ns = int((entry / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        parents[int(entry.name)] = int(rest[1])
        switches = {}
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                switches[key] = int(value)
        counts[int(entry.name)] = name, ProcessCpu(
            int(rest[11]) / tick, int(rest[12]) / tick, switches.get("voluntary_ctxt_switches", 0),
            switches.get("nonvoluntary_ctxt_switches", 0), waiting_ns / 1e9)
    for pid, (name, cpu) in counts.items():
        ancestor = pid
        while ancestor not in (0, 1, root):
            ancestor = parents.get(ancestor, 0)
        if ancestor == root:
            found[f"{pid} {name}"] = cpu
    return found


def inference_count(http_port: int) -> int:
    stats = httpx.get(f"http://{LOOPBACK}:{http_port}/v2/models/add_sub/stats").json()
    return int(stats["model_stats"][0]["inference_count"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), default="http-binary")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--batched", action="store_true", help="add dynamic_batching {} to add_sub")
    parser.add_argument("--ours-flags", default="")
    parser.add_argument("--raw-output", help="also keep py-spy's raw stacks in this file")
    parser.add_argument("--triton", action="store_true", help="measure the real Triton's CPU per request instead "
                        "(no stages: py-spy cannot read it)")
    args = parser.parse_args()
    ports = free_ports()
    scratch = Path(tempfile.mkdtemp(prefix="profile-"))
    repository = REPO / "core" / "example_repository"
    if args.batched:
        repository = with_dynamic_batching(repository, "add_sub", scratch)
    command, env = [str(SCRIPTS / "triton-serve"), *server_flags(repository, "add_sub", ports),
                    *args.ours_flags.split()], dict(os.environ)
    if args.triton:
        command, env = triton_command(server_flags(repository, "add_sub", ports))
    base = f"http://{LOOPBACK}:{ports.http}/v2"
    with running(command, env, [f"{base}/health/ready", f"{base}/models/add_sub/ready"], 120,
                 scratch / "server.log") as server:
        port = ports.grpc if args.protocol == "grpc" else ports.http
        load = subprocess.Popen(
            [str(PERF_ANALYZER), "-m", "add_sub", "-u", f"{LOOPBACK}:{port}", *PROTOCOLS[args.protocol],
             "--concurrency-range", f"{args.concurrency}:{args.concurrency}",
             "--measurement-interval", str((args.seconds + 8) * 1000), "--max-trials", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)  # past perf_analyzer's warm-up
        before = inference_count(ports.http)
        cpu_before = cpu_seconds(server.pid)
        started = time.monotonic()
        raw = scratch / "stacks.txt"
        if args.triton:  # CPU only: py-spy reads Python stacks
            time.sleep(args.seconds)
            raw.write_text("")
        else:
            subprocess.run([str(Path(sys.executable).parent / "py-spy"), "record", "--gil", "--subprocesses",
                            "--nonblocking", "-r", str(args.rate), "-d", str(args.seconds), "-f", "raw", "-o", str(raw),
                            "-p", str(server.pid)], check=True, capture_output=True)
        requests = inference_count(ports.http) - before
        cpu_after = cpu_seconds(server.pid)
        elapsed = time.monotonic() - started
        load.kill()
    if args.raw_output:
        subprocess.run(["cp", str(raw), args.raw_output], check=True)
    samples: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples[stage_of(stack)] += int(count)
    total = max(sum(samples.values()), 1)
    print(f"{args.protocol} c={args.concurrency}{' batched' if args.batched else ''} {args.ours_flags}: "
          f"{requests} requests in {args.seconds} s ({requests / args.seconds:,.0f} infer/s), "
          f"{total / args.rate / args.seconds:.2f} cores holding a GIL\n")
    print("| stage | µs per request | share |\n|---|---|---|")
    for stage, in_stage in samples.most_common():
        print(f"| {stage} | {in_stage / args.rate / requests * 1e6:.1f} | {in_stage / total:.0%} |")
    print(f"| total | {total / args.rate / requests * 1e6:.1f} | 100% |")
    print("\n| process | CPU µs per request: user + system (/proc) | context switches per request: voluntary, "
          "involuntary | main thread waiting for a CPU (share of the time) |")
    print("|---|---|---|---|")
    for process, now in cpu_after.items():
        then = cpu_before.get(process, ProcessCpu(0.0, 0.0, 0, 0, 0.0))
        if now.user + now.system > then.user + then.system:
            print(f"| {process} | {(now.user - then.user) / requests * 1e6:.1f} + "
                  f"{(now.system - then.system) / requests * 1e6:.1f} | "
                  f"{(now.voluntary - then.voluntary) / requests:.2f}, "
                  f"{(now.involuntary - then.involuntary) / requests:.2f} | "
                  f"{(now.runnable_waiting - then.runnable_waiting) / elapsed:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
