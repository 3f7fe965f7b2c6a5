"""add_sub through the Ray Serve deployment (plugins/ray) against triton-serve alone, one after the other (see
bench/README.md); ends with one line of JSON: each protocol and concurrency's Ray/single throughput ratio and added
p50 latency. perf_analyzer: $PERF_ANALYZER when set, else scripts/perf_analyzer."""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import threading
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import run_add_sub  # noqa: E402
from run_add_sub import (  # noqa: E402
    LOOPBACK, PROTOCOLS, REPO, RESULTS, SERVERS, Ports, Result, ServerFailed,
    add_run_arguments, check_run_arguments, fmt_latency, fmt_rate, fmt_ratio, free_ports, measure, running,
    server_flags, start_run,
)

if os.environ.get("PERF_ANALYZER"):
    run_add_sub.PERF_ANALYZER = Path(os.environ["PERF_ANALYZER"])


def deployment(args: argparse.Namespace, ports: Ports) -> dict[str, object]:
    """``deploy``'s arguments: only the model under test, its replicas and the front door each asking for a tenth
    of a CPU so that any replica count fits the machine (Ray's default asks for a whole one)."""
    fraction = {"ray_actor_options": {"num_cpus": 0.1}}
    return {"model_repository": str(args.model_repository), "models": args.model,
            "deployment_options": {args.model: {**fraction, "num_replicas": args.ray_replicas}},
            "ingress_options": fraction, "host": LOOPBACK, "http_port": ports.http, "grpc_port": ports.grpc}


def ray_command(args: argparse.Namespace, ports: Ports) -> tuple[list[str], dict[str, str]]:
    """This script in ``--deploy`` mode: a Ray instance of its own, the deployment, both stopped on SIGINT."""
    return ([sys.executable, __file__, "--deploy", json.dumps(deployment(args, ports))],
            {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


def serve_deployment(arguments: str) -> int:
    """``--deploy``: start a local Ray instance (never another one's), deploy, serve until SIGINT or SIGTERM."""
    import ray
    from ray import serve

    import triton_serve_ray

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    ray.init(address="local", include_dashboard=False)
    try:
        triton_serve_ray.deploy(**json.loads(arguments))
        print("deployed", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


def bench(server: str, args: argparse.Namespace, stem: str) -> list[Result]:
    """Start ``server`` ("ours" alone, or "ray"), run every protocol and concurrency, stop it."""
    matrix = [(protocol, concurrency) for protocol in args.protocols for concurrency in args.concurrency]
    ports = free_ports()
    if server == "ray":
        command, env = ray_command(args, ports)
    else:
        command, env = SERVERS[server](server_flags(args.model_repository, args.model, ports))
    base = f"http://{LOOPBACK}:{ports.http}/v2"
    urls = [f"{base}/health/ready", f"{base}/models/{args.model}/ready"]
    log_path = RESULTS / f"{stem}-{server}.log"
    print(f"{server}: {' '.join(command)[:300]}", flush=True)
    results: list[Result] = []
    try:
        with running(command, env, urls, args.start_timeout, log_path):
            for protocol, concurrency in matrix:
                result = measure(server, protocol, concurrency, ports, args, RESULTS / f"{stem}-last.csv")
                print(f"  {protocol} c={concurrency}: {fmt_rate(result)} {result.detail}", flush=True)
                results.append(result)
    except ServerFailed as error:
        print(f"  {server} failed: {error}", file=sys.stderr)
        results = [Result(server, args.variant, p, c, "error", detail=f"server {error}") for p, c in matrix]
    (RESULTS / f"{stem}-last.csv").unlink(missing_ok=True)
    return results


def markdown(results: list[Result], servers: list[str], header: str) -> str:
    """One row per protocol and concurrency: each server's infer/s, ray/ours, and latencies."""
    by_key = {(r.server, r.protocol, r.concurrency): r for r in results}
    columns = [*(f"{s} infer/s" for s in servers), "ray/ours", *(f"{s} p50 / p99 (µs)" for s in servers)]
    lines = [header, "", "| config | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 1)]
    for protocol, concurrency in dict.fromkeys((r.protocol, r.concurrency) for r in results):
        row = [by_key.get((s, protocol, concurrency)) for s in servers]
        ratio = fmt_ratio(by_key.get(("ray", protocol, concurrency)), by_key.get(("ours", protocol, concurrency)))
        cells = [f"{protocol} c={concurrency}", *(fmt_rate(r) for r in row), ratio, *(fmt_latency(r) for r in row)]
        lines.append("| " + " | ".join(cells) + " |")
    if any(r.status == "unstable" for r in results):
        lines += ["", "`~`: perf_analyzer found no stable measurement (see below); the figure is indicative only."]
    lines += [f"- {r.server} {r.protocol} c={r.concurrency}: {r.status}: {r.detail}" for r in results if r.detail]
    return "\n".join(lines) + "\n"


def cells(results: list[Result]) -> list[dict[str, object]]:
    """Per protocol and concurrency: Ray's infer/s over the single server's, and the p50 latency Ray adds (ms)."""
    by_key = {(r.server, r.protocol, r.concurrency): r for r in results}
    found = []
    for protocol, concurrency in dict.fromkeys((r.protocol, r.concurrency) for r in results):
        ray, ours = by_key.get(("ray", protocol, concurrency)), by_key.get(("ours", protocol, concurrency))
        ratio = added = None
        if ray and ours and ray.infer_per_sec and ours.infer_per_sec:
            ratio = round(ray.infer_per_sec / ours.infer_per_sec, 3)
        if ray and ours and ray.p50_us is not None and ours.p50_us is not None:
            added = round((ray.p50_us - ours.p50_us) / 1000, 3)
        found.append({"protocol": protocol, "concurrency": concurrency, "ratio": ratio, "p50_added_ms": added})
    return found


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-repository", type=Path, default=REPO / "core" / "example_repository")
    parser.add_argument("--model", default="add_sub")
    parser.add_argument("--protocols", nargs="+", choices=list(PROTOCOLS), default=["http-binary", "grpc"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--ray-replicas", type=int, default=1, help="replicas of the model's deployment")
    add_run_arguments(parser, stability=20)  # a busy machine rarely holds 10%, and an unstable run gives no p50
    parser.set_defaults(start_timeout=300)  # Ray starts a cluster, then a process per replica
    args = parser.parse_args()
    check_run_arguments(parser, args)
    try:
        import triton_serve_ray  # noqa: F401
    except ImportError:
        parser.error(f"triton_serve_ray is not installed in {sys.executable}; scripts/install.sh puts it in .venv")
    args.model_repository = args.model_repository.resolve()
    if not (args.model_repository / args.model).is_dir():
        parser.error(f"no model '{args.model}' in {args.model_repository}")
    return args


def main() -> int:
    if sys.argv[1:2] == ["--deploy"]:
        return serve_deployment(sys.argv[2])
    args = parse_args()
    servers = [*start_run(args), "ray"]
    args.variant = "plain"
    started = datetime.now()
    stem = f"ray-{args.model}-{started:%Y%m%d-%H%M%S}"
    results = [result for server in servers for result in bench(server, args, stem)]
    header = (f"## {args.model} through Ray Serve, {started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, "
              f"{platform.platform()}\n\nperf_analyzer: {args.measurement_interval} ms windows, up to "
              f"{args.max_trials} trials, {args.stability_percentage}% stability, batch 1; ray: the "
              f"front door and {args.ray_replicas} model replica(s); servers run one after the other.")
    table = markdown(results, servers, header)
    (RESULTS / f"{stem}.md").write_text(table)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"started": started.isoformat(timespec="seconds"),
         "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
         "machine": platform.platform(), "cpus": os.cpu_count(), "results": [asdict(r) for r in results]},
        indent=2) + "\n")
    print("\n" + table + f"\nwritten: {RESULTS / stem}.md and .json")
    print(json.dumps({"cells": cells(results)}))
    return 0 if all(r.status != "error" for r in results) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the servers were stopped on the way out
        sys.exit(130)
