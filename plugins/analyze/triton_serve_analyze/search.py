"""The searches: each candidate loaded with a config override, swept over concurrency, unloaded; an
exhaustive sweep (with early stop) or a hill-climbing quick search; objectives and constraints."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .measure import MeasureFailed, Measurement, PerfAnalyzer
from .server import LoadFailed, ServerClient, ServerGone
from .space import Candidate, SearchSpace, apply_to_json

MEASURED, LOAD_FAILED, MEASURE_FAILED = "measured", "load failed", "measure failed"


class BudgetSpent(Exception):
    """The time budget ran out; the search stops with what it has."""


@dataclass(frozen=True)
class Goal:
    """The objective (weights of throughput and p99 latency) and the constraints a result must meet."""

    throughput_weight: float = 1.0
    latency_weight: float = 0.0
    max_p99_ms: float | None = None
    min_throughput: float | None = None

    def meets(self, m: Measurement) -> bool:
        return self.violation(m) == 0.0

    def violation(self, m: Measurement) -> float:
        """How far ``m`` is from the constraints, as a sum of relative shortfalls (0: meets them)."""
        over = 0.0
        if self.max_p99_ms is not None:
            over += max(0.0, m.p99_ms / self.max_p99_ms - 1.0)
        if self.min_throughput is not None:
            over += max(0.0, 1.0 - m.throughput / self.min_throughput)
        return over

    def score(self, m: Measurement, best_throughput: float, best_p99_us: float) -> float:
        """Higher is better: weighted throughput and p99, each relative to the best seen for the model."""
        return (self.throughput_weight * m.throughput / max(best_throughput, 1e-9)
                - self.latency_weight * m.p99_us / max(best_p99_us, 1e-9))

    def describe(self) -> str:
        if self.latency_weight == 0:
            objective = "maximum throughput"
        elif self.throughput_weight == 0:
            objective = "minimum p99 latency"
        else:
            objective = f"throughput x{self.throughput_weight:g} against p99 latency x{self.latency_weight:g}"
        limits = []
        if self.max_p99_ms is not None:
            limits.append(f"p99 <= {self.max_p99_ms:g} ms")
        if self.min_throughput is not None:
            limits.append(f"throughput >= {self.min_throughput:g} infer/s")
        return objective + (f" with {' and '.join(limits)}" if limits else "")


@dataclass
class Result:
    """One candidate's outcome: its measurements (concurrency sweep) or why it has none."""

    candidate: Candidate
    status: str
    measurements: list[Measurement] = field(default_factory=list)
    error: str = ""
    partial: bool = False  # the time budget cut its sweep short

    def as_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate.as_dict(), "status": self.status, "error": self.error,
                "measurements": [m.as_dict() for m in self.measurements]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        return cls(Candidate.from_dict(data["candidate"]), data["status"],
                   [Measurement(**m) for m in data["measurements"]], data.get("error", ""))


@dataclass(frozen=True)
class Sweep:
    """How each candidate is measured: client batch sizes, the concurrency ceiling, the gain that keeps
    concurrency doubling."""

    batch_sizes: tuple[int, ...] = (1,)
    max_concurrency: int = 64
    min_gain: float = 0.05

    def concurrencies(self) -> Iterator[int]:
        concurrency = 1
        while concurrency <= self.max_concurrency:
            yield concurrency
            concurrency *= 2


class Checkpoint:
    """Every finished candidate, written after each one, so a rerun of the same command resumes. A
    checkpoint made with other measurement settings is set aside, not mixed in."""

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path = path
        self.settings = settings
        self.results: dict[str, dict[str, dict[str, Any]]] = {}
        self.note = ""
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except ValueError:
                data = {}
            if data.get("settings") == settings:
                self.results = data.get("results", {})
                count = sum(len(v) for v in self.results.values())
                self.note = f"resuming from {path}: {count} candidates already measured"
            else:
                self.note = f"{path} was made with other measurement settings or is damaged: starting afresh"

    def get(self, model: str, candidate: Candidate) -> Result | None:
        stored = self.results.get(model, {}).get(candidate.key)
        return Result.from_dict(stored) if stored else None

    def put(self, model: str, result: Result) -> None:
        self.results.setdefault(model, {})[result.candidate.key] = result.as_dict()
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps({"settings": self.settings, "results": self.results}, indent=1))
        os.replace(scratch, self.path)


@dataclass
class Budget:
    """A deadline on the monotonic clock."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def check(self) -> None:
        if self.elapsed >= self.seconds:
            raise BudgetSpent()


Report = Callable[[str, "ModelSearch"], None]  # (what runs now, the search) -> None: the progress bar


class ModelSearch:
    """The search over one model's candidates against one server."""

    def __init__(self, model: str, base_config: dict[str, Any], space: SearchSpace, goal: Goal, sweep: Sweep,
                 client: ServerClient, perf: PerfAnalyzer, budget: Budget, checkpoint: Checkpoint,
                 on_progress: Report | None = None) -> None:
        self.model, self.base_config, self.space, self.goal, self.sweep = model, base_config, space, goal, sweep
        self.client, self.perf, self.budget, self.checkpoint = client, perf, budget, checkpoint
        self.on_progress = on_progress or (lambda _now, _search: None)
        self.results: dict[str, Result] = {}
        self.order: list[str] = []
        self.stopped_by_budget = False
        self.runs = 0  # candidates measured in this run (not taken from the checkpoint)

    # ---- one candidate -----------------------------------------------------------------------

    def evaluate(self, candidate: Candidate) -> Result:
        """The candidate's result: from the checkpoint, or loaded, measured and unloaded now."""
        if candidate.key in self.results:
            return self.results[candidate.key]
        result = self.checkpoint.get(self.model, candidate)
        if result is None:
            self.budget.check()
            self.on_progress(candidate.key, self)
            result = self._measure(candidate)
            self.runs += 1
            if not result.partial:
                self.checkpoint.put(self.model, result)
        self.results[candidate.key] = result
        self.order.append(candidate.key)
        self.on_progress("", self)
        if result.partial:
            raise BudgetSpent()
        return result

    def _measure(self, candidate: Candidate) -> Result:
        try:
            self.client.load(self.model, apply_to_json(self.base_config, candidate))
        except LoadFailed as error:
            return Result(candidate, LOAD_FAILED, error=str(error))
        result = Result(candidate, MEASURED)
        try:
            for batch_size in self.sweep.batch_sizes:
                if batch_size > max(candidate.max_batch_size, 1):
                    continue
                self._sweep_concurrency(candidate, batch_size, result)
        except BudgetSpent:
            result.partial = True  # kept for this run's report; a resumed run measures it again
            result.error = "the time budget ran out during its concurrency sweep"
        except MeasureFailed as error:
            if not self.client.live():
                raise ServerGone(f"the server at {self.client.url} stopped answering while measuring "
                                 f"{candidate.key}") from None
            result.status, result.error = MEASURE_FAILED, str(error)
        finally:
            if self.client.live():
                try:
                    self.client.unload(self.model)
                except LoadFailed:
                    pass  # the next candidate's load replaces it anyway
        if result.status == MEASURED and not result.measurements:
            result.status, result.error = MEASURE_FAILED, "no client batch size fits this max_batch_size"
        return result

    def _sweep_concurrency(self, candidate: Candidate, batch_size: int, result: Result) -> None:
        """Concurrency 1, 2, 4, ... until throughput grows less than ``min_gain`` twice running (one noisy
        window on a busy machine must not end the sweep early) or p99 passes its limit."""
        best, stalls = 0.0, 0
        for concurrency in self.sweep.concurrencies():
            if result.measurements:
                self.budget.check()
            self.on_progress(f"{candidate.key} b={batch_size} c={concurrency}", self)
            measurement = self.perf.run(self.model, concurrency, batch_size)
            result.measurements.append(measurement)
            if self.goal.max_p99_ms is not None and measurement.p99_ms > self.goal.max_p99_ms:
                return
            stalls = stalls + 1 if best and measurement.throughput < best * (1.0 + self.sweep.min_gain) else 0
            if stalls == 2:
                return
            best = max(best, measurement.throughput)

    # ---- ranking -------------------------------------------------------------------------------

    def measured(self) -> list[Measurement]:
        return [m for r in self.results.values() for m in r.measurements]

    def rank(self, measurement: Measurement) -> tuple[int, float]:
        """Sort key, higher better: a result meeting the constraints beats any that does not; among
        those that do, the objective's score; among those that do not, the smaller violation."""
        if not self.goal.meets(measurement):
            return (0, -self.goal.violation(measurement))
        everything = self.measured()
        best_throughput = max(m.throughput for m in everything)
        best_p99 = min(m.p99_us for m in everything)
        return (1, self.goal.score(measurement, best_throughput, best_p99))

    def best_of(self, result: Result) -> Measurement | None:
        return max(result.measurements, key=self.rank) if result.measurements else None

    def value(self, result: Result) -> tuple[int, float]:
        best = self.best_of(result)
        return self.rank(best) if best is not None else (-1, 0.0)

    def best(self) -> tuple[Result, Measurement] | None:
        """The winning candidate and its chosen measurement, meeting the constraints; None if none does."""
        ranked = [(self.value(r), r) for r in self.results.values() if r.measurements]
        if not ranked:
            return None
        value, result = max(ranked, key=lambda item: item[0])
        best = self.best_of(result)
        return (result, best) if value[0] == 1 and best is not None else None

    def closest(self) -> tuple[Result, Measurement] | None:
        """The measurement nearest to meeting the constraints (when none meets them)."""
        pairs = [(r, m) for r in self.results.values() for m in r.measurements]
        return min(pairs, key=lambda pair: self.goal.violation(pair[1])) if pairs else None

    # ---- the searches ----------------------------------------------------------------------------

    def run(self, mode: str, early_stop: bool = True) -> None:
        try:
            if mode == "quick":
                self._quick()
            else:
                self._exhaustive(early_stop)
        except BudgetSpent:
            self.stopped_by_budget = True

    def _exhaustive(self, early_stop: bool) -> None:
        """Every candidate; along max_batch_size (ascending) a line stops once throughput stops growing."""
        sizes, counts, variants = self.space.shape
        for count in range(counts):
            for variant in range(variants):
                line_best = 0.0
                for size in range(sizes):
                    result = self.evaluate(self.space.candidate(size, count, variant))
                    best = max((m.throughput for m in result.measurements), default=0.0)
                    if early_stop and line_best and best < line_best * (1.0 + self.sweep.min_gain):
                        break
                    line_best = max(line_best, best)

    def _quick(self) -> None:
        """Hill climbing on the grid (max_batch_size, instance count, batching variant): from the smallest
        batch size and one instance, with dynamic batching on where the space has it, measure every
        neighbour one step away in both directions of each axis and move to the best while it improves.
        Where none does, it looks two steps away on each axis (past a plateau or a noisy dip, which
        stopped the plain climb one step short of the best) and goes on from there if one improves;
        it stops when no point one or two steps away does."""
        sizes, counts, variants = self.space.shape
        lengths = (sizes, counts, variants)
        start_variant = next((i for i, v in enumerate(self.space.batching) if v.enabled), 0)
        point: tuple[int, ...] = (0, 0, start_variant)
        current = self.evaluate(self.space.candidate(*point))
        while True:
            moved = self._climb(point, current, lengths)
            if moved is None:
                return
            point, current = moved

    @staticmethod
    def _reaches(lengths: tuple[int, ...]) -> list[list[tuple[int, ...]]]:
        """The offsets tried from a point, in rings: one step on one axis, then two steps on one axis."""
        axes = range(len(lengths))
        one = [tuple(step if a == axis else 0 for a in axes) for axis in axes for step in (-1, 1)]
        two = [tuple(step if a == axis else 0 for a in axes) for axis in axes for step in (-2, 2)]
        return [one, two]

    def _climb(self, point: tuple[int, ...], current: Result,
               lengths: tuple[int, ...]) -> tuple[tuple[int, ...], Result] | None:
        """The best neighbour that beats ``current``, ring by ring (the next ring only when none in the
        nearer one does); None at a local optimum of all rings."""
        for ring in self._reaches(lengths):
            neighbours = [tuple(p + o for p, o in zip(point, offset)) for offset in ring]
            inside = [n for n in neighbours if all(0 <= i < length for i, length in zip(n, lengths))]
            scored = [(self.evaluate(self.space.candidate(*n)), n) for n in inside]
            if not scored:
                continue
            best_result, best_point = max(scored, key=lambda item: self.value(item[0]))
            if self.value(best_result) > self.value(current):
                return best_point, best_result
        return None
