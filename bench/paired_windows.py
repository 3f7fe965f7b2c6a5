"""Compare settings of one running server in paired windows, not across server starts.

On a small shared machine two starts of the same server can differ by 15% for a whole run (where its processes
land, what the host does meanwhile), so settings measured on separate starts mislead. This starts triton-serve on
the example ``add_sub`` once, loads it with ``perf_analyzer`` throughout, and every ``--window`` seconds switches
to the next setting by running ``--switch`` (a shell command; ``{setting}`` in it is replaced, and
``$SERVER_PID`` and ``$CHILD_PIDS``, the server's child processes, are set), then counts the model's inferences
over the window. The settings take turns in rounds, the order reversed every other round; it prints each
setting's windows and its mean against the first setting's.

    .venv/bin/python bench/paired_windows.py --protocol http-json --concurrency 16 --batched \\
        --switch 'for p in $CHILD_PIDS; do renice -n {setting} -p $p; done' 0 5 10

A setting inside the server needs a temporary hook there that ``--switch`` can reach (a signal handler that
reads a file, say: ``--switch 'echo {setting} > /tmp/setting; kill -USR1 $SERVER_PID'``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from profile_stages import inference_count  # noqa: E402
from run_add_sub import (LOOPBACK, PERF_ANALYZER, PROTOCOLS, REPO, SCRIPTS, free_ports, running,  # noqa: E402
                         server_flags, with_dynamic_batching)


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (front-end processes, Python-backend workers)."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("settings", nargs="+", help="the settings, each substituted for {setting} in --switch")
    parser.add_argument("--switch", required=True, help="shell command that puts the server in {setting}")
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), default="http-json")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batched", action="store_true", help="add dynamic_batching {} to add_sub")
    parser.add_argument("--window", type=float, default=2.0, help="seconds counted per setting and round")
    parser.add_argument("--settle", type=float, default=0.3, help="seconds after a switch before counting")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ours-flags", default="")
    args = parser.parse_args()
    if len(args.settings) < 2:
        parser.error("give at least two settings to compare")
    ports = free_ports()
    scratch = Path(tempfile.mkdtemp(prefix="paired-"))
    repository = REPO / "core" / "example_repository"
    if args.batched:
        repository = with_dynamic_batching(repository, "add_sub", scratch)
    command = [str(SCRIPTS / "triton-serve"), *server_flags(repository, "add_sub", ports), *args.ours_flags.split()]
    base = f"http://{LOOPBACK}:{ports.http}/v2"
    windows: dict[str, list[float]] = {setting: [] for setting in args.settings}
    with running(command, dict(os.environ), [f"{base}/health/ready", f"{base}/models/add_sub/ready"], 120,
                 scratch / "server.log") as server:
        port = ports.grpc if args.protocol == "grpc" else ports.http
        seconds = int(args.rounds * len(args.settings) * (args.window + args.settle + 1)) + 30
        load = subprocess.Popen(
            [str(PERF_ANALYZER), "-m", "add_sub", "-u", f"{LOOPBACK}:{port}", *PROTOCOLS[args.protocol],
             "--concurrency-range", f"{args.concurrency}:{args.concurrency}",
             "--measurement-interval", str(seconds * 1000), "--max-trials", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(3)  # past perf_analyzer's warm-up
            env = dict(os.environ, SERVER_PID=str(server.pid), CHILD_PIDS=" ".join(map(str, children(server.pid))))
            for round_number in range(args.rounds):
                order = args.settings if round_number % 2 == 0 else args.settings[::-1]
                for setting in order:
                    subprocess.run(args.switch.replace("{setting}", setting), shell=True, env=env, check=True,
                                   stdout=subprocess.DEVNULL)
                    time.sleep(args.settle)
                    before, started = inference_count(ports.http), time.monotonic()
                    time.sleep(args.window)
                    windows[setting].append((inference_count(ports.http) - before) / (time.monotonic() - started))
        finally:
            load.kill()
    first = args.settings[0]
    print(f"{args.protocol} c={args.concurrency}{' batched' if args.batched else ''}, {args.rounds} rounds of "
          f"{args.window:g} s windows, infer/s:\n")
    print("| setting | windows | mean | mean / first's | windows above the first's |\n|---|---|---|---|---|")
    for setting, rates in windows.items():
        above = sum(rate > base_rate for rate, base_rate in zip(rates, windows[first]))
        print(f"| {setting} | {', '.join(f'{rate:,.0f}' for rate in rates)} | {statistics.mean(rates):,.0f} | "
              f"{statistics.mean(rates) / statistics.mean(windows[first]):.3f} | "
              f"{'-' if setting == first else f'{above} of {args.rounds}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
