"""add_sub through the Ray Serve deployment (plugins/ray) against triton-serve alone, one after the other (see
bench/README.md); ends with one line of JSON: each protocol and concurrency's Ray/single throughput ratio and added
p50 latency. perf_analyzer: $PERF_ANALYZER when set, else scripts/perf_analyzer. With --two-nodes, the deployment
runs on two Ray nodes of this machine (a head and a second node, each started with `ray start`), a replica on
each."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import threading
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).parent))
import run_add_sub  # noqa: E402
from run_add_sub import (  # noqa: E402
    LOOPBACK, PROTOCOLS, REPO, RESULTS, SERVERS, Ports, Result, ServerFailed,
    add_run_arguments, check_run_arguments, fmt_latency, fmt_rate, fmt_ratio, free_ports, measure, running,
    server_flags, start_run,
)

if os.environ.get("PERF_ANALYZER"):
    run_add_sub.PERF_ANALYZER = Path(os.environ["PERF_ANALYZER"])


APP = "triton"  # the Ray Serve application's name
SECOND_NODE_IP = "127.0.0.2"  # --two-nodes: the second node's address (the head has the machine's)
NODES_TIMEOUT_S = 120  # --two-nodes: for both nodes to start, then for both replicas to report their addresses


def deployment(args: argparse.Namespace, ports: Ports) -> dict[str, object]:
    """``deploy``'s arguments: only the model under test, its replicas and the front door each asking for a tenth
    of a CPU so that any replica count fits the machine (Ray's default asks for a whole one); with two nodes, two
    replicas, at most one per node."""
    fraction = {"ray_actor_options": {"num_cpus": 0.1}}
    replicas = {"num_replicas": 2, "max_replicas_per_node": 1} if args.two_nodes else {
        "num_replicas": args.ray_replicas}
    return {"model_repository": str(args.model_repository), "models": args.model,
            "deployment_options": {args.model: {**fraction, **replicas}},
            "ingress_options": fraction, "host": LOOPBACK, "http_port": ports.http, "grpc_port": ports.grpc}


def ray_command(args: argparse.Namespace, ports: Ports) -> tuple[list[str], dict[str, str]]:
    """This script in ``--deploy`` mode: a Ray instance (or two-node cluster) of its own, the deployment, both
    stopped on SIGINT."""
    spec = {"deploy": deployment(args, ports), "node_cpus": args.node_cpus if args.two_nodes else None}
    return [sys.executable, __file__, "--deploy", json.dumps(spec)], {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}


def serve_deployment(arguments: str) -> int:
    """``--deploy``: start a local Ray instance, or a head and a second node (``node_cpus`` each) with ``ray
    start`` (never another's cluster), deploy, serve until SIGINT or SIGTERM, stop what it started."""
    import ray
    from ray import serve

    import triton_serve_ray
    from triton_serve_ray.local_cluster import LocalCluster, NodeSpec

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    spec = json.loads(arguments)
    with contextlib.ExitStack() as started:
        if spec["node_cpus"] is None:
            ray.init(address="local", include_dashboard=False)
        else:
            nodes = [NodeSpec(spec["node_cpus"]), NodeSpec(spec["node_cpus"], ip=SECOND_NODE_IP)]
            cluster = started.enter_context(LocalCluster(nodes, start_timeout_s=NODES_TIMEOUT_S))
            ray.init(address=cluster.address)
        started.callback(ray.shutdown)
        started.callback(serve.shutdown)
        triton_serve_ray.deploy(**spec["deploy"], name=APP)
        if spec["node_cpus"] is not None:
            hosts = replica_hosts(spec["deploy"]["models"])
            if len(hosts) != 2:
                print(f"expected a replica on each of two nodes, found them on {hosts}", flush=True)
                return 1
            print(f"replicas on nodes {', '.join(hosts)}", flush=True)
        print("deployed", flush=True)
        stop.wait()
    return 0


def replica_hosts(model: str) -> list[str]:
    """The node addresses of ``model``'s replicas in the routing table, once both replicas report (bounded)."""
    import ray

    from triton_serve_ray.registry import registry_of

    deadline = time.monotonic() + NODES_TIMEOUT_S
    while True:
        table = cast(dict[str, list[str]], ray.get(registry_of(APP).replicas.remote(), timeout=30))
        addresses = table.get(model, [])
        if len(addresses) >= 2 or time.monotonic() > deadline:
            return sorted(address.rsplit(":", 1)[0] for address in addresses)
        time.sleep(0.5)


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
    parser.add_argument("--two-nodes", action="store_true",
                        help="a head and a second Ray node on this machine (ray start), one replica on each")
    parser.add_argument("--node-cpus", type=float, default=1, help="--two-nodes: logical CPUs of each node")
    add_run_arguments(parser, stability=20)  # a busy machine rarely holds 10%, and an unstable run gives no p50
    parser.set_defaults(start_timeout=300)  # Ray starts a cluster, then a process per replica
    args = parser.parse_args()
    check_run_arguments(parser, args)
    if args.two_nodes and args.ray_replicas != 1:
        parser.error("--two-nodes runs one replica on each node; leave --ray-replicas out")
    if args.node_cpus <= 0:
        parser.error("--node-cpus must be positive")
    try:
        import triton_serve_ray  # noqa: F401
    except ImportError:
        parser.error(f"triton_serve_ray is not installed in {sys.executable}; scripts/install.sh puts it in .venv")
    args.model_repository = args.model_repository.resolve()
    if not (args.model_repository / args.model).is_dir():
        parser.error(f"no model '{args.model}' in {args.model_repository}")
    return args


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages (what else ran while this measured)."""
    return " / ".join(f"{load:.2f}" for load in os.getloadavg())


def main() -> int:
    if sys.argv[1:2] == ["--deploy"]:
        return serve_deployment(sys.argv[2])
    args = parse_args()
    servers = [*start_run(args), "ray"]
    args.variant = "plain"
    started, load_at_start = datetime.now(), load_average()
    stem = f"ray{'-two-nodes' if args.two_nodes else ''}-{args.model}-{started:%Y%m%d-%H%M%S}"
    results = [result for server in servers for result in bench(server, args, stem)]
    load_at_end = load_average()
    layout = (f"2 model replicas, one on each of two Ray nodes of this machine ({args.node_cpus:g} CPUs each)"
              if args.two_nodes else f"{args.ray_replicas} model replica(s)")
    header = (f"## {args.model} through Ray Serve, {started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, "
              f"{platform.platform()}; load average (1 / 5 / 15 min) {load_at_start} at the start, "
              f"{load_at_end} at the end\n\nperf_analyzer: {args.measurement_interval} "
              f"ms windows, up to {args.max_trials} trials, {args.stability_percentage}% stability, batch 1; ray: "
              f"the front door and {layout}; servers run one after the other.")
    table = markdown(results, servers, header)
    (RESULTS / f"{stem}.md").write_text(table)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"started": started.isoformat(timespec="seconds"), "load_average": [load_at_start, load_at_end],
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
