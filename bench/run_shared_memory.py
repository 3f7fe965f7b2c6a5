"""System shared memory against plain requests, on triton-serve and optionally Triton (see bench/README.md)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run_add_sub import (  # noqa: E402
    LOOPBACK, REPO, RESULTS, SERVERS, Result, ServerFailed,
    add_run_arguments, check_run_arguments, fmt_rate, fmt_ratio, free_ports, measure, running, server_flags, start_run,
)

IDENTITY = "identity_4mb"
IDENTITY_ELEMENTS = 1 << 20  # FP32: 4 MiB in, 4 MiB out
IDENTITY_CONFIG = f"""name: "{IDENTITY}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ {IDENTITY_ELEMENTS} ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ {IDENTITY_ELEMENTS} ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""
IDENTITY_MODEL = '''"""identity_4mb: OUTPUT0 is INPUT0."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())])
            for request in requests]
'''
# Bytes of each model's largest output: perf_analyzer's --output-shared-memory-size (one region per output).
OUTPUT_BYTES = {"add_sub": 16 * 4, IDENTITY: IDENTITY_ELEMENTS * 4}
SHM_PROTOCOLS = ["http-binary", "grpc"]
MODES = ["no-shm", "shm"]


@dataclass
class Row:
    model: str
    result: Result


def write_identity(scratch: Path) -> Path:
    """A repository holding only identity_4mb, a Python model that returns its input."""
    (scratch / IDENTITY / "1").mkdir(parents=True)
    (scratch / IDENTITY / "config.pbtxt").write_text(IDENTITY_CONFIG)
    (scratch / IDENTITY / "1" / "model.py").write_text(IDENTITY_MODEL)
    return scratch


def mode_flags(model: str, mode: str) -> tuple[str, ...]:
    if mode == "no-shm":
        return ()
    return ("--shared-memory", "system", "--output-shared-memory-size", str(OUTPUT_BYTES[model]))


def bench_model(server: str, model: str, repository: Path, args: argparse.Namespace, stem: str) -> list[Row]:
    """Start ``server`` with only ``model`` loaded and measure every protocol without and with shared memory."""
    args.model = model
    matrix = [(protocol, mode) for protocol in args.protocols for mode in MODES]
    ports = free_ports()
    command, env = SERVERS[server](server_flags(repository, model, ports))
    base = f"http://{LOOPBACK}:{ports.http}/v2"
    urls = [f"{base}/health/ready", f"{base}/models/{model}/ready"]
    log_path = RESULTS / f"{stem}-{server}-{model}.log"
    csv_path = RESULTS / f"{stem}-last.csv"
    print(f"{server}: {' '.join(command)}", flush=True)
    rows: list[Row] = []
    try:
        with running(command, env, urls, args.start_timeout, log_path):
            for protocol, mode in matrix:
                args.variant = mode
                result = measure(server, protocol, args.concurrency, ports, args, csv_path, mode_flags(model, mode))
                print(f"  {model} {protocol} {mode}: {fmt_rate(result)} {result.detail}", flush=True)
                rows.append(Row(model, result))
    except ServerFailed as error:
        print(f"  {server} failed: {error}", file=sys.stderr)
        rows = [Row(model, Result(server, mode, protocol, args.concurrency, "error", detail=f"server {error}"))
                for protocol, mode in matrix]
    csv_path.unlink(missing_ok=True)
    return rows


def markdown(rows: list[Row], servers: list[str], header: str) -> str:
    """One line per model and protocol: each server's no-shm and shm infer/s, the shm gain, and ours/Triton."""
    by_key = {(r.model, r.result.server, r.result.protocol, r.result.variant): r.result for r in rows}
    columns = ["model", "protocol"]
    for server in servers:
        columns += [f"{server} no-shm infer/s", f"{server} shm infer/s", f"{server} shm gain"]
    if len(servers) == 2:
        columns += ["ours/triton no-shm", "ours/triton shm"]
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for model, protocol in dict.fromkeys((r.model, r.result.protocol) for r in rows):
        cells = [model, protocol]
        for server in servers:
            plain, shm = (by_key.get((model, server, protocol, mode)) for mode in MODES)
            cells += [fmt_rate(plain), fmt_rate(shm), fmt_ratio(shm, plain)]
        if len(servers) == 2:
            cells += [fmt_ratio(*(by_key.get((model, s, protocol, mode)) for s in servers)) for mode in MODES]
        lines.append("| " + " | ".join(cells) + " |")
    if any(r.result.status == "unstable" for r in rows):
        lines += ["", "`~`: perf_analyzer found no stable measurement (see below); the figure is indicative only."]
    notes: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        if r.result.detail:
            key = (r.result.server, r.result.status, r.result.detail)
            notes.setdefault(key, []).append(f"{r.model} {r.result.protocol} {r.result.variant}")
    if notes:
        lines.append("")
        lines += [f"- {server} {', '.join(configs)}: {status}: {detail}"
                  for (server, status, detail), configs in notes.items()]
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--protocols", nargs="+", choices=SHM_PROTOCOLS, default=SHM_PROTOCOLS)
    parser.add_argument("--concurrency", type=int, default=4)
    add_run_arguments(parser, interval_ms=2000, max_trials=4, stability=20, attempts=1)
    args = parser.parse_args()
    check_run_arguments(parser, args)
    return args


def main() -> int:
    args = parse_args()
    servers = start_run(args)
    started = datetime.now()
    stem = f"shared_memory-{started:%Y%m%d-%H%M%S}"
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-shm-") as scratch:
        repositories = {"add_sub": REPO / "core" / "example_repository", IDENTITY: write_identity(Path(scratch))}
        for server in servers:
            for model, repository in repositories.items():
                rows += bench_model(server, model, repository, args, stem)
    del args.model, args.variant
    header = (f"## shared memory, {started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, {platform.platform()}\n\n"
              f"perf_analyzer at concurrency {args.concurrency}: {args.measurement_interval} ms windows, up to "
              f"{args.max_trials} trials, {args.stability_percentage}% stability, {args.attempts} attempt(s); "
              "shm is `--shared-memory system`; servers run one after the other, one model loaded at a time.")
    table = markdown(rows, servers, header)
    (RESULTS / f"{stem}.md").write_text(table)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"started": started.isoformat(timespec="seconds"), "settings": vars(args), "machine": platform.platform(),
         "cpus": os.cpu_count(), "results": [{"model": r.model, **asdict(r.result)} for r in rows]}, indent=2) + "\n")
    print("\n" + table + f"\nwritten: {RESULTS / stem}.md and .json")
    return 0 if all(r.result.status != "error" for r in rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the servers were stopped on the way out
        sys.exit(130)
