"""Measure add_sub on triton-serve, and optionally on the real Triton, with perf_analyzer (see bench/README.md)."""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PERF_ANALYZER = REPO / "scripts" / "perf_analyzer"
# Console scripts (triton-serve, serve) of the interpreter running the bench, not whichever PATH finds first.
SCRIPTS = Path(sys.executable).parent
TRITON_HOME = REPO / "tritonserver"
TRITON_VENV = REPO / "triton-venv"
RESULTS = REPO / "bench" / "results"
PROTOCOLS = {
    "http-binary": ["-i", "http"],
    "http-json": ["-i", "http", "--input-tensor-format", "json", "--output-tensor-format", "json"],
    "grpc": ["-i", "grpc"],
}
UNSTABLE = "Failed to obtain stable measurement"
LOOPBACK = "127.0.0.1"
# urllib would otherwise honour http_proxy even for loopback addresses.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Ports:
    http: int
    grpc: int
    metrics: int


@dataclass
class Result:
    server: str
    variant: str  # "plain" (the model's own config) or "batched" (dynamic_batching added)
    protocol: str
    concurrency: int
    status: str  # "ok"; "unstable" (infer/s is the mean of the last windows, no percentiles); "error"
    infer_per_sec: float | None = None
    p50_us: int | None = None
    p99_us: int | None = None
    detail: str = ""


class ServerFailed(RuntimeError):
    """The server exited or did not get its model ready in time."""


def free_ports() -> Ports:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(3)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return Ports(*(sock.getsockname()[1] for sock in sockets))


def server_flags(repository: Path, model: str, ports: Ports) -> list[str]:
    """Flags both servers share: only ``model`` is loaded, every endpoint on loopback."""
    flags = [f"--model-repository={repository}", "--model-control-mode=explicit", f"--load-model={model}",
             "--exit-on-error=true"]
    for name, port in (("http", ports.http), ("grpc", ports.grpc), ("metrics", ports.metrics)):
        flags += [f"--{name}-address={LOOPBACK}", f"--{name}-port={port}"]
    return flags


OURS_FLAGS: list[str] = []  # --ours-flags


def ours_command(flags: list[str]) -> tuple[list[str], dict[str, str]]:
    return [str(SCRIPTS / "triton-serve"), *flags, *OURS_FLAGS], dict(os.environ)


def triton_command(flags: list[str]) -> tuple[list[str], dict[str, str]]:
    """The real Triton as scripts/install.sh --with-triton lays it out; the stub needs the venv's numpy on PATH."""
    site = next((TRITON_VENV / "lib").glob("python3*/site-packages"))
    env = {**os.environ, "LD_LIBRARY_PATH": str(site / "nvidia_pytriton.libs"),
           "PATH": f"{TRITON_VENV / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    command = [str(TRITON_HOME / "bin" / "tritonserver"), *flags,
               f"--backend-directory={TRITON_HOME / 'backends'}", f"--cache-directory={TRITON_HOME / 'caches'}",
               "--allow-gpu-metrics=false", "--exit-timeout-secs=10"]
    return command, env


def floor_command(flags: list[str]) -> tuple[list[str], dict[str, str]]:
    """bench/floor_server.py: what any process-isolated Python server pays (HTTP binary, add_sub only)."""
    return [sys.executable, str(Path(__file__).with_name("floor_server.py")), *flags], dict(os.environ)


SERVERS = {"ours": ours_command, "triton": triton_command, "floor": floor_command}
FLOOR_PROTOCOLS = ("http-binary",)  # the floor speaks nothing else


def is_ok(url: str) -> bool:
    try:
        with HTTP.open(url, timeout=1):  # raises HTTPError (an OSError) unless the status is 2xx
            return True
    except OSError:
        return False


def wait_ready(process: subprocess.Popen[bytes], urls: list[str], timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while not all(is_ok(url) for url in urls):
        if process.poll() is not None:
            raise ServerFailed(f"exited with status {process.returncode} before ready; log: {log_path}")
        if time.monotonic() > deadline:
            raise ServerFailed(f"not ready after {timeout:.0f} s; log: {log_path}")
        time.sleep(0.25)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT (a graceful stop for both servers); the whole process group is killed if that hangs."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            print(f"  server {process.pid} ignored SIGINT for 30 s; killing it", file=sys.stderr)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # also reaps backend children left behind
    process.wait()


@contextlib.contextmanager
def running(command: list[str], env: dict[str, str], urls: list[str], timeout: float,
            log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(process, urls, timeout, log_path)
            yield process
        finally:
            stop(process)


def parse_csv(path: Path) -> tuple[float, int, int]:
    with open(path, newline="") as file:
        row = next(csv.DictReader(file))
    return float(row["Inferences/Second"]), int(row["p50 latency"]), int(row["p99 latency"])


def measure(server: str, protocol: str, concurrency: int, ports: Ports, args: argparse.Namespace,
            csv_path: Path, extra: tuple[str, ...] = ()) -> Result:
    """One perf_analyzer run (``extra``: more of its flags), repeated up to ``--attempts`` times while unstable or
    while it runs past its time (perf_analyzer 2.51 now and then stops getting answers over HTTP at c=16, from
    either server)."""
    port = ports.grpc if protocol == "grpc" else ports.http
    command = [str(PERF_ANALYZER), "-v", "-m", args.model, "-u", f"{LOOPBACK}:{port}", *PROTOCOLS[protocol],
               "--concurrency-range", f"{concurrency}:{concurrency}",
               "--measurement-interval", str(args.measurement_interval), "--max-trials", str(args.max_trials),
               "--stability-percentage", str(args.stability_percentage), "-f", str(csv_path), *extra]
    timeout = 2 * args.max_trials * args.measurement_interval / 1000 + 30
    result = Result(server, args.variant, protocol, concurrency, "error")
    output = ""
    for _ in range(args.attempts):
        csv_path.unlink(missing_ok=True)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            continue
        if done.returncode == 0:
            result.status = "ok"
            result.infer_per_sec, result.p50_us, result.p99_us = parse_csv(csv_path)
            return result
        output = done.stdout + done.stderr
        if UNSTABLE not in output:
            lines = output.strip().splitlines()
            result.detail = f"perf_analyzer exited {done.returncode}: {lines[-1] if lines else ''}"
            return result
    if not output:
        result.detail = f"perf_analyzer ran past {timeout:.0f} s in each of {args.attempts} attempt(s)"
        return result
    passes = [float(v) for v in re.findall(r"Pass \[\d+\] throughput: ([\d.]+)", output)]
    result.status = "unstable"
    result.infer_per_sec = statistics.mean(passes[-3:]) if passes else None
    result.detail = f"no stable measurement in {args.attempts} attempt(s); infer/s is the mean of the last 3 windows"
    return result


def with_dynamic_batching(repository: Path, model: str, scratch: Path, delay_us: int = 0) -> Path:
    """``scratch``, holding a copy of ``model`` whose config.pbtxt gains ``dynamic_batching`` with ``delay_us``
    (replacing any it had): a repository to serve instead of ``repository``."""
    target = scratch / model
    shutil.copytree(repository / model, target)
    config = (target / "config.pbtxt").read_text()
    config = re.sub(r"dynamic_batching\s*\{[^}]*\}", "", config)
    (target / "config.pbtxt").write_text(config + f"\ndynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n")
    return scratch


def bench_servers(servers: list[str], args: argparse.Namespace, stem: str, repository: Path) -> list[Result]:
    """Every cell (protocol, concurrency) on each of ``servers``, started side by side and taking turns: at each
    cell one server after the other, in ``servers`` order and backwards at the next cell, so that the machine's
    drift over the minutes of a run falls on every server alike (an idle server costs nothing: its loops sleep)."""
    matrix = [(protocol, concurrency) for protocol in args.protocols for concurrency in args.concurrency]
    cells = {server: [(p, c) for p, c in matrix if server != "floor" or p in FLOOR_PROTOCOLS] for server in servers}
    results: dict[str, list[Result]] = {server: [] for server in servers}
    with contextlib.ExitStack() as stack:
        up: dict[str, Ports] = {}
        for server in servers:
            ports = free_ports()
            command, env = SERVERS[server](server_flags(repository, args.model, ports))
            base = f"http://{LOOPBACK}:{ports.http}/v2"
            print(f"{server}: {' '.join(command)}", flush=True)
            try:
                stack.enter_context(running(command, env, [f"{base}/health/ready", f"{base}/models/{args.model}/ready"],
                                            args.start_timeout, RESULTS / f"{stem}-{server}-{args.variant}.log"))
                up[server] = ports
            except ServerFailed as error:
                print(f"  {server} failed: {error}", file=sys.stderr)
                results[server] = [Result(server, args.variant, p, c, "error", detail=f"server {error}")
                                   for p, c in cells[server]]
        for index, (protocol, concurrency) in enumerate(matrix):
            for server in (servers if index % 2 == 0 else servers[::-1]):
                if server not in up or (protocol, concurrency) not in cells[server]:
                    continue
                result = measure(server, protocol, concurrency, up[server], args, RESULTS / f"{stem}-last.csv")
                print(f"  {server} {args.variant} {protocol} c={concurrency}: {fmt_rate(result)} {result.detail}",
                      flush=True)
                results[server].append(result)
    (RESULTS / f"{stem}-last.csv").unlink(missing_ok=True)
    return [result for server in servers for result in results[server]]


def fmt_rate(result: Result | None) -> str:
    if result is None or result.infer_per_sec is None:
        return "error" if result else "-"
    return f"{'~' if result.status == 'unstable' else ''}{result.infer_per_sec:,.0f}"


def fmt_latency(result: Result | None) -> str:
    if result is None or result.p50_us is None:
        return "-"
    return f"{result.p50_us:,} / {result.p99_us:,}"


def fmt_ratio(ours: Result | None, triton: Result | None) -> str:
    if ours and triton and ours.infer_per_sec and triton.infer_per_sec:
        approx = "~" if "unstable" in (ours.status, triton.status) else ""
        return f"{approx}{ours.infer_per_sec / triton.infer_per_sec:.2f}"
    return "-"


def markdown(results: list[Result], servers: list[str], header: str) -> str:
    by_key = {(r.server, r.variant, r.protocol, r.concurrency): r for r in results}
    columns = ["config", *(f"{s} infer/s" for s in servers)]
    ratios = [s for s in servers if s != "ours"] if "ours" in servers else []
    columns += [f"ours/{s}" for s in ratios]
    columns += [f"{s} p50 / p99 (µs)" for s in servers]
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for variant, protocol, concurrency in dict.fromkeys((r.variant, r.protocol, r.concurrency) for r in results):
        row = [by_key.get((s, variant, protocol, concurrency)) for s in servers]
        cells = [f"{variant} {protocol} c={concurrency}", *(fmt_rate(r) for r in row)]
        cells += [fmt_ratio(row[0], by_key.get((s, variant, protocol, concurrency))) for s in ratios]
        cells += [fmt_latency(r) for r in row]
        lines.append("| " + " | ".join(cells) + " |")
    if any(r.status == "unstable" for r in results):
        lines += ["", "`~`: perf_analyzer found no stable measurement (see below); the figure is indicative only."]
    notes: dict[tuple[str, str, str], list[str]] = {}
    for r in results:
        if r.detail:
            notes.setdefault((r.server, r.status, r.detail), []).append(f"{r.variant} {r.protocol} c={r.concurrency}")
    if notes:
        lines.append("")
        lines += [f"- {server} {', '.join(configs)}: {status}: {detail}"
                  for (server, status, detail), configs in notes.items()]
    return "\n".join(lines) + "\n"


def add_run_arguments(parser: argparse.ArgumentParser, *, interval_ms: int = 3000, max_trials: int = 8,
                      stability: int = 10, attempts: int = 2) -> None:
    """The perf_analyzer and server flags every bench script shares (``check_run_arguments`` checks them)."""
    parser.add_argument("--measurement-interval", type=int, default=interval_ms, help="ms per measurement window")
    parser.add_argument("--max-trials", type=int, default=max_trials)
    parser.add_argument("--stability-percentage", type=int, default=stability)
    parser.add_argument("--attempts", type=int, default=attempts, help="perf_analyzer runs per config while unstable")
    parser.add_argument("--start-timeout", type=float, default=120, help="seconds for a server to get ready")
    parser.add_argument("--ours-flags", default="",
                        help="extra triton-serve flags, e.g. '--frontend-processes=1 --http-server=hypercorn'")
    parser.add_argument("--with-triton", action="store_true",
                        help="also run the real Triton 2.51 (scripts/install.sh --with-triton), after ours")


def check_run_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.attempts < 1:
        parser.error("--attempts must be at least 1")
    if subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True).returncode != 0:
        parser.error(f"{PERF_ANALYZER} does not run; run scripts/install.sh first")
    if args.with_triton and not (TRITON_HOME / "bin" / "tritonserver").exists():
        parser.error("no tritonserver/ in the repository; run scripts/install.sh --with-triton first")


def start_run(args: argparse.Namespace) -> list[str]:
    """Apply the shared flags before a run; the servers it measures, in order."""
    OURS_FLAGS.extend(args.ours_flags.split())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so that running servers are stopped
    RESULTS.mkdir(parents=True, exist_ok=True)
    return ["ours", *(["triton"] if args.with_triton else []), *(["floor"] if getattr(args, "with_floor", False) else [])]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-repository", type=Path, default=REPO / "core" / "example_repository")
    parser.add_argument("--model", default="add_sub")
    parser.add_argument("--protocols", nargs="+", choices=list(PROTOCOLS), default=list(PROTOCOLS))
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--variants", nargs="+", choices=["plain", "batched"], default=["plain"],
                        help="plain: the model as configured; batched: a copy with dynamic_batching added")
    parser.add_argument("--max-queue-delay-us", type=int, default=0,
                        help="max_queue_delay_microseconds of the batched variant")
    add_run_arguments(parser)
    parser.add_argument("--with-floor", action="store_true",
                        help="also run bench/floor_server.py, last: the bound of a Python server with its model in "
                             "another process (plain HTTP binary add_sub only)")
    args = parser.parse_args()
    check_run_arguments(parser, args)
    if args.with_floor and args.model != "add_sub":
        parser.error("--with-floor serves add_sub only")
    args.model_repository = args.model_repository.resolve()
    if not (args.model_repository / args.model).is_dir():
        parser.error(f"no model '{args.model}' in {args.model_repository}")
    return args


def main() -> int:
    args = parse_args()
    servers = start_run(args)
    started = datetime.now()
    stem = f"{args.model}-{started:%Y%m%d-%H%M%S}"
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-batched-") as scratch:
        for variant in args.variants:
            args.variant = variant
            repository = args.model_repository
            if variant == "batched":
                repository = with_dynamic_batching(repository, args.model, Path(scratch), args.max_queue_delay_us)
            results += bench_servers([server for server in servers if server != "floor" or variant == "plain"],
                                     args, stem, repository)
    del args.variant
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    header = (f"## {args.model}, {started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, {platform.platform()}\n\n"
              f"perf_analyzer: {args.measurement_interval} ms windows, up to {args.max_trials} trials, "
              f"{args.stability_percentage}% stability, batch 1; the servers run side by side and take turns "
              "at each cell.")
    table = markdown(results, servers, header)
    (RESULTS / f"{stem}.md").write_text(table)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"started": started.isoformat(timespec="seconds"), "settings": settings, "machine": platform.platform(),
         "cpus": os.cpu_count(), "results": [asdict(r) for r in results]}, indent=2) + "\n")
    print("\n" + table + f"\nwritten: {RESULTS / stem}.md and .json")
    return 0 if all(r.status != "error" for r in results) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the servers were stopped on the way out
        sys.exit(130)
