"""One measurement: perf_analyzer at one concurrency and client batch size, read from its CSV."""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PERF_ANALYZER_ENV = "PERF_ANALYZER"
# What perf_analyzer prints when its windows are too short for the model or the machine: one ended before any
# request in it finished, or its windows' rates were further apart than even the stability percentage allows
# (a stall in one of them).
NO_VALID_REQUESTS = "No valid requests recorded within time interval"
UNSTABLE = "Failed to obtain stable measurement"
WINDOW_TOO_SHORT = (NO_VALID_REQUESTS, UNSTABLE)
WIDER_WINDOW_RETRIES = 2


@dataclass(frozen=True)
class Measurement:
    """What perf_analyzer reports for one load level; latencies in microseconds."""

    concurrency: int
    batch_size: int
    throughput: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float

    @property
    def p99_ms(self) -> float:
        return self.p99_us / 1000.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class MeasureFailed(Exception):
    """perf_analyzer ran but gave no result (the message is its last lines)."""


@dataclass
class PerfAnalyzer:
    """How to run perf_analyzer: its path, protocol, window length and count, and extra flags."""

    path: str
    url: str
    protocol: str = "http"
    measurement_interval_ms: int = 1000
    max_trials: int = 3
    stability_percentage: float = 999.0
    extra_flags: tuple[str, ...] = ()

    @staticmethod
    def find(given: str | None) -> str:
        """``--perf-analyzer``, else $PERF_ANALYZER, else ``perf_analyzer`` on PATH."""
        for candidate in (given, os.environ.get(PERF_ANALYZER_ENV), shutil.which("perf_analyzer")):
            if candidate:
                if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
                    raise FileNotFoundError(f"perf_analyzer '{candidate}' is not an executable file")
                return candidate
        raise FileNotFoundError("perf_analyzer not found: pass --perf-analyzer PATH or set $PERF_ANALYZER "
                                "(a triton-serve checkout's scripts/install.sh installs scripts/perf_analyzer)")

    def _seconds_per_run(self, interval_ms: int) -> float:
        """A generous bound on one run (its windows, warm-up and start-up), for the subprocess timeout."""
        return interval_ms / 1000.0 * (self.max_trials + 2) * 3 + 60.0

    def run(self, model: str, concurrency: int, batch_size: int) -> Measurement:
        """One measurement. Windows too short for the model or the machine (``WINDOW_TOO_SHORT``: a stall, or a
        model slower than the window) are measured again in windows four times as long, twice at most."""
        windows_ms = [self.measurement_interval_ms * 4**retry for retry in range(1 + WIDER_WINDOW_RETRIES)]
        for interval_ms in windows_ms:
            measurement = self._run_once(model, concurrency, batch_size, interval_ms)
            if isinstance(measurement, Measurement):
                return measurement
        raise MeasureFailed(f"perf_analyzer: {measurement}, in windows of up to {windows_ms[-1]} ms")

    def _run_once(self, model: str, concurrency: int, batch_size: int, interval_ms: int) -> Measurement | str:
        """One perf_analyzer run: its measurement, or which of ``WINDOW_TOO_SHORT`` it printed."""
        with tempfile.TemporaryDirectory(prefix="tserve-analyze-") as scratch:
            report = Path(scratch) / "pa.csv"
            command = [self.path, "-m", model, "-u", self.url, "-i", self.protocol,
                       "--concurrency-range", f"{concurrency}:{concurrency}", "-b", str(batch_size),
                       "--measurement-interval", str(interval_ms),
                       "--max-trials", str(self.max_trials), "--stability-percentage", f"{self.stability_percentage:g}",
                       "-f", str(report), *self.extra_flags]
            timeout = self._seconds_per_run(interval_ms)
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise MeasureFailed(f"perf_analyzer ran past {timeout:.0f} s") from None
            if done.returncode != 0 or not report.exists():
                printed = done.stdout + done.stderr
                too_short = next((message for message in WINDOW_TOO_SHORT if message in printed), None)
                if too_short is not None:
                    return too_short
                tail = " | ".join(printed.strip().splitlines()[-3:])
                raise MeasureFailed(f"perf_analyzer exited with status {done.returncode}: {tail}")
            with report.open() as handle:
                rows = list(csv.DictReader(handle))
        if not rows:
            raise MeasureFailed("perf_analyzer wrote an empty report")
        row = rows[0]
        return Measurement(concurrency, batch_size, float(row["Inferences/Second"]), float(row["p50 latency"]),
                           float(row["p90 latency"]), float(row["p95 latency"]), float(row["p99 latency"]))
