"""Where the time of one request goes: µs of GIL-holding CPU per request, per stage, in every process.

Starts triton-serve on the example ``add_sub`` (only that model), loads it with ``perf_analyzer`` at one
concurrency and protocol, and meanwhile samples the server and all its child processes (front-end
processes, the Python-backend worker) with ``py-spy record --gil --subprocesses``. Each sample is
charged to the stage of its innermost frame that belongs to a known module; the model's inference
count before and after gives requests served, so

    µs per request in a stage = samples in the stage / sampling rate / requests * 1e6

Native time outside the GIL (grpc's C core, socket syscalls done without the GIL) is not sampled.

    .venv/bin/python bench/profile_stages.py --protocol http --concurrency 16 [--ours-flags="--frontend-processes=0"]
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

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from run_add_sub import LOOPBACK, PERF_ANALYZER, REPO, SCRIPTS, free_ports, running, server_flags  # noqa: E402

# (stage, markers): the first stage one of whose markers appears in a frame, innermost frame first.
STAGES = [
    ("model.py execute (worker)", ("model_repository/add_sub",)),
    ("python backend: worker side", ("triton_serve_python/worker.py", "triton_serve_python/runner.py",
                                     "triton_serve_python/pb_utils", "triton_serve_python/protocol.py")),
    ("python backend: server side", ("triton_serve_python/",)),
    ("dynamic batcher", ("triton_serve_batching/",)),
    ("instance pool, statistics", ("triton_serve/scheduling.py", "triton_serve/statistics.py",
                                   "triton_serve/ratelimit.py")),
    ("validation, output shaping", ("triton_serve/route.py",)),
    ("data plane", ("triton_serve/dataplane.py", "triton_serve/inference.py")),
    ("owner <-> front-end channel", ("triton_serve/channel.py", "triton_serve/frontend_pool.py",
                                     "triton_serve/frontend_process.py")),
    ("HTTP codec and handler", ("triton_serve/http/",)),
    ("gRPC codec and servicer", ("triton_serve/grpc_frontend/",)),
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


def inference_count(http_port: int) -> int:
    stats = httpx.get(f"http://{LOOPBACK}:{http_port}/v2/models/add_sub/stats").json()
    return int(stats["model_stats"][0]["inference_count"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--batched", action="store_true", help="add dynamic_batching {} to add_sub")
    parser.add_argument("--ours-flags", default="")
    args = parser.parse_args()
    ports = free_ports()
    scratch = Path(tempfile.mkdtemp(prefix="profile-"))
    repository = REPO / "core" / "example_repository"
    if args.batched:
        (scratch / "add_sub").mkdir()
        subprocess.run(["cp", "-r", str(repository / "add_sub"), str(scratch)], check=True)
        config = scratch / "add_sub" / "config.pbtxt"
        config.write_text(config.read_text() + "\ndynamic_batching { }\n")
        repository = scratch
    command = [str(SCRIPTS / "triton-serve"), *server_flags(repository, "add_sub", ports), *args.ours_flags.split()]
    base = f"http://{LOOPBACK}:{ports.http}/v2"
    with running(command, dict(os.environ), [f"{base}/health/ready", f"{base}/models/add_sub/ready"], 120,
                 scratch / "server.log") as server:
        port = ports.http if args.protocol == "http" else ports.grpc
        load = subprocess.Popen(
            [str(PERF_ANALYZER), "-m", "add_sub", "-u", f"{LOOPBACK}:{port}", "-i", args.protocol,
             "--concurrency-range", f"{args.concurrency}:{args.concurrency}",
             "--measurement-interval", str((args.seconds + 8) * 1000), "--max-trials", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)  # past perf_analyzer's warm-up
        before = inference_count(ports.http)
        raw = scratch / "stacks.txt"
        subprocess.run(["py-spy", "record", "--gil", "--subprocesses", "--nonblocking", "-r", str(args.rate),
                        "-d", str(args.seconds), "-f", "raw", "-o", str(raw), "-p", str(server.pid)],
                       check=True, capture_output=True)
        requests = inference_count(ports.http) - before
        load.kill()
    samples: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples[stage_of(stack)] += int(count)
    total = sum(samples.values())
    print(f"{args.protocol} c={args.concurrency}{' batched' if args.batched else ''} {args.ours_flags}: "
          f"{requests} requests in {args.seconds} s ({requests / args.seconds:,.0f} infer/s), "
          f"{total / args.rate / args.seconds:.2f} cores holding a GIL\n")
    print("| stage | µs per request | share |\n|---|---|---|")
    for stage, count in samples.most_common():
        print(f"| {stage} | {count / args.rate / requests * 1e6:.1f} | {count / total:.0%} |")
    print(f"| total | {total / args.rate / requests * 1e6:.1f} | 100% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
