"""Reload a model while clients keep sending it requests: failed requests, and client-side latency in
steady state against latency during reloads, for triton-serve and optionally the real Triton (see
bench/README.md)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from run_add_sub import LOOPBACK, REPO, RESULTS, SERVERS, ServerFailed, free_ports, running, server_flags, start_run

ROUND_PARAMETER = 'parameters {{ key: "reload_round" value {{ string_value: "{round}" }} }}\n'


@dataclass
class Sample:
    start: float  # time.monotonic() when the request was sent
    end: float
    error: str = ""  # the server's message for a failed request


@dataclass
class Phase:
    """The requests of one phase: how many, how many failed, latency percentiles in milliseconds."""

    requests: int = 0
    failed: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    errors: list[str] = field(default_factory=list)  # up to 3 distinct messages

    @classmethod
    def of(cls, samples: list[Sample]) -> Phase:
        phase = cls(len(samples), sum(1 for s in samples if s.error))
        phase.errors = list(dict.fromkeys(s.error for s in samples if s.error))[:3]
        latencies = sorted((s.end - s.start) * 1000 for s in samples if not s.error)
        if latencies:
            phase.p50_ms = round(statistics.median(latencies), 2)
            phase.p99_ms = round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2)
            phase.max_ms = round(latencies[-1], 2)
        return phase


@dataclass
class Outcome:
    server: str
    status: str  # "ok" or "error"
    steady: Phase = field(default_factory=Phase)
    reloading: Phase = field(default_factory=Phase)
    reload_seconds: list[float] = field(default_factory=list)
    detail: str = ""


class Drivers:
    """``concurrency`` threads, each sending one request after another and recording every one."""

    def __init__(self, url: str, model: str, concurrency: int) -> None:
        self.url = url
        self.model = model
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._drive, daemon=True) for _ in range(concurrency)]

    def __enter__(self) -> Drivers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _drive(self) -> None:
        client = httpclient.InferenceServerClient(self.url, connection_timeout=120, network_timeout=120)
        inputs = _inputs(client.get_model_metadata(self.model))
        samples = []
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                client.infer(self.model, inputs)
                samples.append(Sample(start, time.monotonic()))
            except InferenceServerException as error:
                samples.append(Sample(start, time.monotonic(), error.message() or str(error)))
        self.samples.extend(samples)


def _inputs(metadata: dict) -> list[httpclient.InferInput]:
    """One request's inputs for any model: each dimension -1 becomes 1, the values are zeros."""
    inputs = []
    for spec in metadata["inputs"]:
        shape = [1 if int(d) < 0 else int(d) for d in spec["shape"]]
        tensor = httpclient.InferInput(spec["name"], shape, spec["datatype"])
        dtype = triton_to_np_dtype(spec["datatype"])
        data = np.full(shape, b"x", dtype=np.object_) if dtype == np.object_ else np.zeros(shape, dtype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


def change_model(model_dir: Path, change: str, round_number: int, base_config: str) -> None:
    """What makes a reload: a config.pbtxt that differs (a parameter holds the round), or a new version
    folder (a copy of the newest one)."""
    if change == "config":
        (model_dir / "config.pbtxt").write_text(base_config + "\n" + ROUND_PARAMETER.format(round=round_number))
    else:
        newest = max(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
        shutil.copytree(model_dir / str(newest), model_dir / str(newest + 1))


def bench_server(server: str, args: argparse.Namespace, stem: str) -> Outcome:
    outcome = Outcome(server, "error")
    with tempfile.TemporaryDirectory(prefix="bench-reload-") as scratch:
        repository = Path(scratch)
        model_dir = repository / args.model
        shutil.copytree(args.model_repository / args.model, model_dir,
                        ignore=shutil.ignore_patterns("__pycache__"))
        base_config = (model_dir / "config.pbtxt").read_text()
        ports = free_ports()
        command, env = SERVERS[server](server_flags(repository, args.model, ports))
        url = f"{LOOPBACK}:{ports.http}"
        ready = [f"http://{url}/v2/health/ready", f"http://{url}/v2/models/{args.model}/ready"]
        print(f"{server}: {' '.join(command)}", flush=True)
        try:
            with running(command, env, ready, args.start_timeout, RESULTS / f"{stem}-{server}.log"):
                control = httpclient.InferenceServerClient(url, connection_timeout=300, network_timeout=300)
                windows: list[tuple[float, float]] = []
                with Drivers(url, args.model, args.concurrency) as drivers:
                    time.sleep(args.steady_secs)
                    for round_number in range(1, args.reloads + 1):
                        change_model(model_dir, args.change, round_number, base_config)
                        began = time.monotonic()
                        control.load_model(args.model)
                        windows.append((began, time.monotonic()))
                        print(f"  reload {round_number}: {windows[-1][1] - began:.2f} s", flush=True)
                        time.sleep(args.gap_secs)
        except (ServerFailed, InferenceServerException) as error:
            outcome.detail = str(error)
            print(f"  {server} failed: {error}", file=sys.stderr)
            return outcome
    steady: list[Sample] = []
    during: list[Sample] = []
    for sample in drivers.samples:  # a request that overlaps a reload, or its settling time, counts as during
        overlaps = any(sample.start <= end + args.settle_secs and sample.end >= began for began, end in windows)
        (during if overlaps else steady).append(sample)
    outcome.status = "ok"
    outcome.steady, outcome.reloading = Phase.of(steady), Phase.of(during)
    outcome.reload_seconds = [round(end - began, 3) for began, end in windows]
    return outcome


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def markdown(outcomes: list[Outcome], header: str) -> str:
    lines = [header, "", "| server | phase | requests | failed | p50 ms | p99 ms | max ms |",
             "|---|---|---|---|---|---|---|"]
    for outcome in outcomes:
        if outcome.status != "ok":
            lines.append(f"| {outcome.server} | error: {outcome.detail} | | | | | |")
            continue
        for name, phase in (("steady", outcome.steady), ("during reloads", outcome.reloading)):
            lines.append(f"| {outcome.server} | {name} | {phase.requests:,} | {phase.failed:,} | {fmt(phase.p50_ms)} "
                         f"| {fmt(phase.p99_ms)} | {fmt(phase.max_ms)} |")
    lines.append("")
    for outcome in outcomes:
        if outcome.reload_seconds:
            took = ", ".join(f"{seconds:.2f}" for seconds in outcome.reload_seconds)
            lines.append(f"- {outcome.server}: each load call took {took} s")
        for error in outcome.steady.errors + outcome.reloading.errors:
            lines.append(f"- {outcome.server} failed request: {error}")
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-repository", type=Path, default=REPO / "core" / "example_repository")
    parser.add_argument("--model", default="add_sub")
    parser.add_argument("--change", choices=["config", "version"], default="config",
                        help="config: each reload follows a changed config.pbtxt; version: a new version folder")
    parser.add_argument("--reloads", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=4, help="client threads sending requests")
    parser.add_argument("--steady-secs", type=float, default=5, help="load before the first reload")
    parser.add_argument("--gap-secs", type=float, default=3, help="load between reloads")
    parser.add_argument("--settle-secs", type=float, default=1,
                        help="how long after a load call returns its requests still count as 'during reloads'")
    parser.add_argument("--start-timeout", type=float, default=120, help="seconds for a server to get ready")
    parser.add_argument("--ours-flags", default="", help="extra triton-serve flags, e.g. '--frontend-processes=2'")
    parser.add_argument("--with-triton", action="store_true",
                        help="also run the real Triton 2.51 (scripts/install.sh --with-triton), after ours")
    args = parser.parse_args()
    args.model_repository = args.model_repository.resolve()
    if not (args.model_repository / args.model).is_dir():
        parser.error(f"no model '{args.model}' in {args.model_repository}")
    if args.reloads < 1 or args.concurrency < 1:
        parser.error("--reloads and --concurrency must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    servers = start_run(args)
    started = datetime.now()
    stem = f"reload-{args.model}-{started:%Y%m%d-%H%M%S}"
    outcomes = [bench_server(server, args, stem) for server in servers]
    header = (f"## reload {args.model} ({args.change} change) x{args.reloads}, {args.concurrency} clients, "
              f"{started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, {platform.platform()}")
    report = markdown(outcomes, header)
    print("\n" + report)
    (RESULTS / f"{stem}.md").write_text(report)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"settings": settings, "outcomes": [asdict(o) for o in outcomes]}, indent=2))
    return 0 if all(o.status == "ok" and not o.steady.failed and not o.reloading.failed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
