"""``triton-serve analyze``: flags, the server (given or started), the search per model, the outputs."""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import TextIO

from .configfile import write_config
from .measure import PerfAnalyzer
from .report import ModelOutcome, summary, terminal_table, write_csv, write_html
from .search import Budget, Checkpoint, Goal, ModelSearch, Sweep
from .server import LoadFailed, LocalServer, ServerClient, ServerGone
from .space import SearchSpace, check_model_config, ensembles_calling, keep_what_dependents_allow

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNMET = 0, 1, 2, 3


def _int_list(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        values = []
    if not values or any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got '{text}'")
    return values


def _positive_list(text: str) -> list[int]:
    values = _int_list(text)
    if 0 in values:
        raise argparse.ArgumentTypeError(f"expected numbers of 1 or more, got '{text}'")
    return values


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got '{text}'")
    return value


def _trials(text: str) -> int:
    value = _positive(text)
    if value < 3 or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a whole number of 3 or more (perf_analyzer compares the "
                                         f"last 3 windows), got '{text}'")
    return int(value)


def _objective(text: str) -> tuple[float, float]:
    """``throughput``, ``latency``, or ``throughput=W,latency=W``: (throughput weight, latency weight)."""
    if text in ("throughput", "latency"):
        return (1.0, 0.0) if text == "throughput" else (0.0, 1.0)
    weights = {"throughput": 0.0, "latency": 0.0}
    for item in text.split(","):
        name, _, value = item.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if name not in weights or weight < 0:
            raise argparse.ArgumentTypeError(f"expected throughput, latency or throughput=<w>,latency=<w>, "
                                             f"got '{text}'")
        weights[name] = weight
    if not any(weights.values()):
        raise argparse.ArgumentTypeError(f"the objective's weights are all 0 in '{text}'")
    return weights["throughput"], weights["latency"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triton-serve analyze",
        description="Find the model configuration (max_batch_size, instance count, dynamic batching) that best "
                    "meets an objective under latency and throughput constraints: each candidate is loaded "
                    "through the server's load API with a config override, measured with perf_analyzer over "
                    "rising concurrency, and unloaded. See docs/analyze.md.")
    add = parser.add_argument
    add("--model-repository", required=True, help="the model repository (the running server's, with --url)")
    add("--model", dest="models", action="append", required=True, help="model to analyze (repeatable)")
    add("--url", help="HTTP address of a running server (triton-serve or Triton, --model-control-mode=explicit); "
                      "default: start triton-serve on free loopback ports")
    add("--server-arg", dest="server_args", action="append", default=[],
        help="extra flag for the triton-serve that analyze starts (repeatable, e.g. --server-arg=--log-verbose=1)")
    goal = parser.add_argument_group("objective and constraints")
    goal.add_argument("--objective", type=_objective, default=(1.0, 0.0), metavar="OBJECTIVE",
                      help="throughput (default), latency (p99), or a weighted mix: throughput=<w>,latency=<w>")
    goal.add_argument("--max-latency-p99-ms", type=_positive, help="p99 latency limit in milliseconds")
    goal.add_argument("--min-throughput", type=_positive, help="throughput floor in inferences per second")
    space = parser.add_argument_group("search")
    space.add_argument("--search", choices=["quick", "exhaustive"], default="quick",
                       help="quick: hill climbing from the smallest configuration (default); exhaustive: every "
                            "candidate, each max_batch_size line stopping once throughput stops growing")
    space.add_argument("--no-early-stop", action="store_true",
                       help="exhaustive: measure every candidate, even after throughput stops growing")
    space.add_argument("--max-batch-sizes", type=_positive_list, default=[1, 2, 4, 8, 16, 32], metavar="N,N,...",
                       help="max_batch_size values (default 1,2,4,8,16,32; a model with max_batch_size 0 keeps 0)")
    space.add_argument("--instance-counts", type=_positive_list, default=[1, 2, 3], metavar="N,N,...",
                       help="instance_group counts (default 1,2,3)")
    space.add_argument("--dynamic-batching", choices=["on", "off", "both"], default="both",
                       help="try dynamic batching on, off or both (default both)")
    space.add_argument("--max-queue-delays-us", type=_int_list, default=[0, 100, 1000], metavar="N,N,...",
                       help="dynamic batching max_queue_delay_microseconds values (default 0,100,1000)")
    space.add_argument("--preferred-batch-sizes", action="store_true",
                       help="also try each delay with preferred_batch_size: [max_batch_size]")
    space.add_argument("--time-budget", type=_positive, default=600.0, metavar="SECONDS",
                       help="stop measuring after this many seconds, for all models together (default 600)")
    measure = parser.add_argument_group("measurement (perf_analyzer)")
    measure.add_argument("--perf-analyzer", help="perf_analyzer executable (default: $PERF_ANALYZER, then PATH)")
    measure.add_argument("--perf-analyzer-flag", dest="perf_flags", action="append", default=[],
                         help="extra perf_analyzer flag, e.g. --perf-analyzer-flag=--shape=INPUT:4 (repeatable)")
    measure.add_argument("--batch-sizes", type=_positive_list, default=[1], metavar="N,N,...",
                         help="client batch sizes perf_analyzer sends (default 1)")
    measure.add_argument("--max-concurrency", type=int, default=64,
                         help="concurrency doubles from 1 up to this (default 64)")
    measure.add_argument("--min-throughput-gain", type=float, default=5.0, metavar="PERCENT",
                         help="stop raising concurrency (and max_batch_size, exhaustive) when throughput grows "
                              "by less than this (default 5)")
    measure.add_argument("--measurement-interval-ms", type=int, default=1000,
                         help="perf_analyzer --measurement-interval (default 1000)")
    measure.add_argument("--max-trials", type=_trials, default=3,
                         help="perf_analyzer --max-trials, 3 or more: it judges stability over the last 3 "
                              "windows (default 3)")
    measure.add_argument("--stability-percentage", type=float, default=999.0,
                         help="perf_analyzer --stability-percentage (default 999: report the last windows "
                              "whatever their spread, so a busy machine cannot stall the sweep)")
    out = parser.add_argument_group("output")
    out.add_argument("--output-dir",
                     help="report.html, measurements.csv, checkpoint.json, server.log (default "
                          "$XDG_CACHE_HOME/triton-serve/analyze/<models>, ~/.cache when unset: outside the "
                          "current directory, and the same for the same models, so a run resumes there)")
    out.add_argument("--output-model-repository",
                     help="write <dir>/<model>/config.pbtxt (and the model's files) there instead of "
                          "<model>/configs/analyzed.pbtxt in the model repository")
    out.add_argument("--checkpoint", help="checkpoint file (default <output-dir>/checkpoint.json)")
    out.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint")
    return parser


class Progress:
    """A one-line progress bar on a terminal (the time budget spent, the current candidate, the best so
    far); elsewhere one line per finished candidate."""

    def __init__(self, stream: TextIO, budget: Budget, space_size: int) -> None:
        self.stream, self.budget, self.space_size = stream, budget, space_size
        self.tty = stream.isatty()

    def __call__(self, now: str, search: ModelSearch) -> None:
        best = search.best()
        best_text = (f"best {best[1].throughput:,.0f} infer/s p99 {best[1].p99_ms:.2f} ms ({best[0].candidate.key})"
                     if best else "best -")
        done = len(search.results)
        if self.tty:
            fraction = min(1.0, self.budget.elapsed / self.budget.seconds)
            bar = "#" * int(fraction * 20)
            line = (f"[{bar:<20}] {self.budget.elapsed:4.0f}/{self.budget.seconds:.0f}s {search.model} "
                    f"{done}/{self.space_size} now {now or '-'} | {best_text}")
            width = shutil.get_terminal_size((120, 20)).columns
            self.stream.write("\r" + line[:width - 1].ljust(width - 1))
            self.stream.flush()
        elif not now and search.order:
            key = search.order[-1]
            result = search.results[key]
            self.stream.write(f"[{self.budget.elapsed:4.0f}s] {search.model} {done}/{self.space_size} "
                              f"{key}: {result.status} | {best_text}\n")

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    command = "triton-serve analyze " + shlex.join(argv)
    try:
        perf_path = PerfAnalyzer.find(args.perf_analyzer)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    output_dir = Path(args.output_dir) if args.output_dir else default_output_dir(args.models)
    args.output_dir = str(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    repository = Path(args.model_repository)
    if args.url is None and not repository.is_dir():
        print(f"error: model repository '{repository}' is not a directory", file=sys.stderr)
        return EXIT_USAGE
    goal = Goal(args.objective[0], args.objective[1], args.max_latency_p99_ms, args.min_throughput)
    sweep = Sweep(tuple(args.batch_sizes), args.max_concurrency, args.min_throughput_gain / 100.0)
    settings = {"batch_sizes": args.batch_sizes, "max_concurrency": args.max_concurrency,
                "min_gain": sweep.min_gain, "interval_ms": args.measurement_interval_ms,
                "max_trials": args.max_trials, "stability": args.stability_percentage, "flags": args.perf_flags}
    checkpoint_path = Path(args.checkpoint) if args.checkpoint else output_dir / "checkpoint.json"
    if args.fresh:
        checkpoint_path.unlink(missing_ok=True)
    checkpoint = Checkpoint(checkpoint_path, settings)
    if checkpoint.note:
        print(checkpoint.note, file=sys.stderr)
    budget = Budget(args.time_budget)
    local: LocalServer | None = None
    outcomes: list[ModelOutcome] = []
    status = EXIT_OK
    try:
        if args.url is None:
            local = LocalServer(str(repository), output_dir / "server.log", args.server_args)
            client = local.client
        else:
            client = ServerClient(args.url)
        perf = PerfAnalyzer(perf_path, client.host_port, "http", args.measurement_interval_ms, args.max_trials,
                            args.stability_percentage, tuple(args.perf_flags))
        known = client.models()
        unknown = [m for m in args.models if m not in known]
        if unknown:
            print(f"error: model '{unknown[0]}' is not in the server's model repository "
                  f"(models: {', '.join(sorted(known)) or 'none'})", file=sys.stderr)
            return EXIT_USAGE
        for model in args.models:
            outcome = _analyze_model(model, known[model] == "READY", args, client, perf, goal, sweep, budget,
                                     checkpoint, repository, outcomes)
            if outcome is None:
                status = EXIT_USAGE
            elif outcome.chosen is None:
                status = max(status, EXIT_UNMET)
    except ServerGone as error:
        tail = f" (server log: {local.log_tail(3)})" if local is not None else ""
        print(f"\nerror: {error}{tail}. {_kept(checkpoint_path)}", file=sys.stderr)
        status = EXIT_ERROR
    except KeyboardInterrupt:
        print(f"\ninterrupted. {_kept(checkpoint_path)}", file=sys.stderr)
        status = 130
    finally:
        if local is not None:
            local.stop()
    _write_outputs(outcomes, output_dir, command)
    return status


def default_output_dir(models: list[str]) -> Path:
    """Where results go without ``--output-dir``: a cache folder named after the models analyzed."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "triton-serve" / "analyze" / "+".join(sorted(models))


def _kept(checkpoint: Path) -> str:
    return f"Finished candidates are kept in {checkpoint}: run the same command again to resume."


def _analyze_model(model: str, was_ready: bool, args: argparse.Namespace, client: ServerClient,
                   perf: PerfAnalyzer, goal: Goal, sweep: Sweep, budget: Budget, checkpoint: Checkpoint,
                   repository: Path, outcomes: list[ModelOutcome]) -> ModelOutcome | None:
    """Search one model; its outcome joins ``outcomes`` as soon as it exists (so an error still reports it)."""
    try:
        if not was_ready:
            client.load(model)
        served = client.config(model)
        check_model_config(model, served)
    except (LoadFailed, ValueError) as error:
        print(f"error: model '{model}' cannot be analyzed: {error}", file=sys.stderr)
        return None
    space = SearchSpace.build(served, args.max_batch_sizes, args.instance_counts, args.dynamic_batching,
                              args.max_queue_delays_us, args.preferred_batch_sizes)
    if repository.is_dir():
        note = keep_what_dependents_allow(space, model, ensembles_calling(repository, model))
        if note:
            print(note)
    progress = Progress(sys.stderr, budget, space.size)
    search = ModelSearch(model, served, space, goal, sweep, client, perf, budget, checkpoint, progress)
    started = time.monotonic()
    outcome = ModelOutcome(search, args.search, None, None, None, 0.0)
    outcomes.append(outcome)
    try:
        search.run(args.search, early_stop=not args.no_early_stop)
    finally:
        progress.finish()
        outcome.seconds = time.monotonic() - started
        outcome.chosen, outcome.closest = search.best(), search.closest()
    _restore(client, model, was_ready, args.url is not None)
    if outcome.chosen is not None:
        result, measurement = outcome.chosen
        how = (f"{args.search} search over {len(search.results)} candidates for {goal.describe()}; "
               f"report: {Path(args.output_dir).resolve() / 'report.html'}")
        local_dir = repository / model if (repository / model).is_dir() else None
        output_repo = Path(args.output_model_repository) if args.output_model_repository else None
        outcome.config_path = write_config(model, local_dir, output_repo, Path(args.output_dir), served,
                                           result.candidate, measurement, how)
    print(terminal_table(outcome))
    print("\n".join(summary(outcome)))
    return outcome


def _restore(client: ServerClient, model: str, was_ready: bool, remote: bool) -> None:
    """Leave a server we did not start as we found it: the model served from its repository config, or not
    loaded."""
    if not remote:
        return
    try:
        if was_ready:
            client.load(model)
        else:
            client.unload(model)
    except LoadFailed as error:
        print(f"warning: could not restore model '{model}' on the server: {error}", file=sys.stderr)


def _write_outputs(outcomes: list[ModelOutcome], output_dir: Path, command: str) -> None:
    if not outcomes:
        return
    write_csv(output_dir / "measurements.csv", outcomes)
    write_html(output_dir / "report.html", outcomes, command)
    output_dir = output_dir.resolve()
    print(f"report: {output_dir / 'report.html'}; every measurement: {output_dir / 'measurements.csv'}")

