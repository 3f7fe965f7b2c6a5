"""A stand-in for perf_analyzer in the fast tests: writes perf_analyzer's CSV with made-up figures.

Throughput is 1000 x min(concurrency, 4) (+100 per max_batch_size step is not known here, so the
figures depend on concurrency only); p99 is $FAKE_PA_P99_US (default 500). With $FAKE_PA_KILL_PID
and $FAKE_PA_KILL_AT=N, the N-th run (counted in $FAKE_PA_COUNTER) kills that process and fails. A
--measurement-interval below $FAKE_PA_MIN_INTERVAL_MS fails as perf_analyzer does when no request finished
in a window, one below $FAKE_PA_STABLE_FROM_MS as it does when its windows never agree; each run's interval is
appended to $FAKE_PA_INTERVALS.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

args = sys.argv[1:]
if args == ["--version"]:
    print("Perf Analyzer Version 2.51.0 (fake)")
    sys.exit(0)
counter = Path(os.environ["FAKE_PA_COUNTER"]) if "FAKE_PA_COUNTER" in os.environ else None
count = int(counter.read_text()) + 1 if counter is not None and counter.exists() else 1
if counter is not None:
    counter.write_text(str(count))
if os.environ.get("FAKE_PA_KILL_AT") == str(count):
    os.kill(int(os.environ["FAKE_PA_KILL_PID"]), signal.SIGKILL)
    print("error: failed to connect", file=sys.stderr)
    sys.exit(99)
interval_ms = int(args[args.index("--measurement-interval") + 1])
if "FAKE_PA_INTERVALS" in os.environ:
    with open(os.environ["FAKE_PA_INTERVALS"], "a") as intervals:
        intervals.write(f"{interval_ms}\n")
if interval_ms < int(os.environ.get("FAKE_PA_MIN_INTERVAL_MS", "0")):
    print("Request concurrency: 1\nNo valid requests recorded within time interval. Please use a larger time window.")
    sys.exit(3)
if interval_ms < int(os.environ.get("FAKE_PA_STABLE_FROM_MS", "0")):
    print("Request concurrency: 1\nFailed to obtain stable measurement within 3 measurement windows for concurrency 1."
          " Please try to increase the --measurement-interval.\nFailed to obtain stable measurement.")
    sys.exit(2)
concurrency = int(args[args.index("--concurrency-range") + 1].split(":")[0])
p99 = float(os.environ.get("FAKE_PA_P99_US", "500"))
throughput = 1000.0 * min(concurrency, 4)
Path(args[args.index("-f") + 1]).write_text(
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    f"{concurrency},{throughput},1,1,1,1,1,1,1,{p99 / 2},{p99 * 0.8},{p99 * 0.9},{p99}\n")
