"""What metrics cost requests: add_sub throughput with no scrape, with a 1 s /metrics scrape loop, and
with the scrape loop plus ``--metrics-config=summary_latencies=true`` (see bench/README.md)."""
from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
from datetime import datetime
from pathlib import Path

from run_add_sub import (HTTP, LOOPBACK, PROTOCOLS, REPO, RESULTS, SERVERS, Result, ServerFailed, add_run_arguments,
                         check_run_arguments, fmt_rate, free_ports, measure, running, server_flags, start_run)

# name -> (extra server flags, whether a scrape loop runs during the measurement)
SETUPS: dict[str, tuple[list[str], bool]] = {
    "no scrape": ([], False),
    "1 s scrape": ([], True),
    "1 s scrape + summaries": (["--metrics-config=summary_latencies=true"], True),
}


class ScrapeLoop:
    """Reads ``url`` once a second on a thread, as a Prometheus server would, until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.scrapes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ScrapeLoop:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                with HTTP.open(self.url, timeout=5) as response:
                    response.read()
                self.scrapes += 1
            except OSError:
                self.failures += 1


def bench_setup(server: str, setup: str, args: argparse.Namespace, stem: str) -> list[Result]:
    extra, scrape = SETUPS[setup]
    ports = free_ports()
    command, env = SERVERS[server](server_flags(args.model_repository, args.model, ports) + extra)
    base = f"http://{LOOPBACK}:{ports.http}/v2"
    log_path = RESULTS / f"{stem}-{server}-{setup.replace(' ', '_').replace('+', 'and')}.log"
    print(f"{server} [{setup}]: {' '.join(command)}", flush=True)
    results = []
    try:
        with running(command, env, [f"{base}/health/ready"], args.start_timeout, log_path):
            for concurrency in args.concurrency:
                args.variant = setup
                if scrape:
                    with ScrapeLoop(f"http://{LOOPBACK}:{ports.metrics}/metrics") as loop:
                        result = measure(server, args.protocol, concurrency, ports, args, RESULTS / f"{stem}-last.csv")
                    result.detail = f"{loop.scrapes} scrapes, {loop.failures} failed"
                else:
                    result = measure(server, args.protocol, concurrency, ports, args, RESULTS / f"{stem}-last.csv")
                print(f"  c={concurrency}: {fmt_rate(result)} {result.detail}", flush=True)
                results.append(result)
    except ServerFailed as error:
        print(f"  {server} failed: {error}", file=sys.stderr)
    (RESULTS / f"{stem}-last.csv").unlink(missing_ok=True)
    return results


def markdown(results: list[Result], servers: list[str], header: str, concurrency: list[int]) -> str:
    def rate(server: str, setup: str, c: int) -> float | None:
        found = [r for r in results if (r.server, r.variant, r.concurrency) == (server, setup, c)]
        return found[0].infer_per_sec if found and found[0].status != "error" else None

    lines = [header, "", "| server | setup | " + " | ".join(f"c={c} infer/s (ratio to no scrape)" for c in concurrency)
             + " |", "|---|---|" + "---|" * len(concurrency)]
    for server in servers:
        for setup in SETUPS:
            cells = []
            for c in concurrency:
                value, base = rate(server, setup, c), rate(server, "no scrape", c)
                cells.append("error" if value is None else
                             f"{value:,.0f}" + (f" ({value / base:.2f})" if base else ""))
            lines.append(f"| {server} | {setup} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-repository", type=Path, default=REPO / "core" / "example_repository")
    parser.add_argument("--model", default="add_sub")
    parser.add_argument("--protocol", choices=list(PROTOCOLS), default="http-binary")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[4, 16])
    add_run_arguments(parser)
    args = parser.parse_args()
    check_run_arguments(parser, args)
    args.model_repository = args.model_repository.resolve()
    servers = start_run(args)
    started = datetime.now()
    stem = f"metrics-overhead-{started:%Y%m%d-%H%M%S}"
    results = [r for server in servers for setup in SETUPS for r in bench_setup(server, setup, args, stem)]
    header = (f"## Metrics overhead, {args.model} over {args.protocol}, {started:%Y-%m-%d %H:%M}, "
              f"{os.cpu_count()} CPUs, {platform.platform()}\n\nperf_analyzer: {args.measurement_interval} ms "
              f"windows, up to {args.max_trials} trials; each setup on a fresh server, one after the other.")
    table = markdown(results, servers, header, args.concurrency)
    (RESULTS / f"{stem}.md").write_text(table)
    print("\n" + table + f"\nwritten: {RESULTS / stem}.md")
    return 0 if results and all(r.status != "error" for r in results) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
