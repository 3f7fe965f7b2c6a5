"""Serve an ONNX MLP and an XGBoost forest under perf_analyzer and compare each with the same model run
in-process by its framework alone, the floor (see bench/README.md)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from run_add_sub import PERF_ANALYZER, PROTOCOLS, RESULTS, Result, bench_servers, fmt_latency, fmt_rate

MAX_BATCH_SIZE = 32
SEED = 0
MLP_FEATURES, MLP_HIDDEN, MLP_OUTPUTS = 64, 256, 16
FOREST_FEATURES, FOREST_DEPTH, FOREST_TRAINING_ROWS = 32, 6, 4096


@dataclass
class Floor:
    """The model run in-process by its framework, one call after another: the most a server could serve."""

    label: str
    rows_per_call: int
    rows_per_sec: float


@dataclass(frozen=True)
class Framework:
    """One benchmarked model: the function that writes its file (and says what it is), its config, its floors."""

    model: str
    write: Callable[[Path, argparse.Namespace], str]
    config: str
    floors: Callable[[Path, float], list[Floor]]
    variants: tuple[str, ...]


def sample_rows(rows: int, features: int) -> np.ndarray:
    return np.random.default_rng(SEED).standard_normal((rows, features), dtype=np.float32)


def rows_per_sec(call: Callable[[], object], rows_per_call: int, seconds: float) -> float:
    """Rows per second of ``call`` run back to back for ``seconds``, after a short warm-up."""
    for _ in range(20):
        call()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        calls += 1
    return calls * rows_per_call / (time.perf_counter() - start)


def write_mlp(version_dir: Path, args: argparse.Namespace) -> str:
    """A two-layer MLP with random weights, FP32 [N, 64] -> 256 -> ReLU -> [N, 16], built with onnx.helper."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(SEED)
    shapes = {"w1": (MLP_FEATURES, MLP_HIDDEN), "b1": (MLP_HIDDEN,), "w2": (MLP_HIDDEN, MLP_OUTPUTS),
              "b2": (MLP_OUTPUTS,)}
    weights = [numpy_helper.from_array(rng.standard_normal(shape, dtype=np.float32) * 0.1, name)
               for name, shape in shapes.items()]
    nodes = [helper.make_node("Gemm", ["INPUT0", "w1", "b1"], ["hidden"]),
             helper.make_node("Relu", ["hidden"], ["activated"]),
             helper.make_node("Gemm", ["activated", "w2", "b2"], ["OUTPUT0"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", MLP_FEATURES])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", MLP_OUTPUTS])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    version_dir.mkdir(parents=True)
    onnx.save(model, version_dir / "model.onnx")
    return (f"ONNX MLP, FP32 [N, {MLP_FEATURES}] -> Gemm {MLP_HIDDEN} -> ReLU -> Gemm -> [N, {MLP_OUTPUTS}], "
            f"backend onnxruntime (CPU)")


def mlp_floors(version_dir: Path, seconds: float) -> list[Floor]:
    """ONNX Runtime on the CPU with default session options, as the backend opens it by default."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(version_dir / "model.onnx"), onnxruntime.SessionOptions(),
                                           providers=["CPUExecutionProvider"])
    one, sixteen = sample_rows(1, MLP_FEATURES), sample_rows(16, MLP_FEATURES)
    return [
        Floor("onnxruntime b1", 1, rows_per_sec(lambda: session.run(["OUTPUT0"], {"INPUT0": one}), 1, seconds)),
        Floor("onnxruntime b16", 16,
              rows_per_sec(lambda: session.run(["OUTPUT0"], {"INPUT0": sixteen}), 16, seconds)),
    ]


def write_forest(version_dir: Path, args: argparse.Namespace) -> str:
    """An XGBoost binary classifier trained on random rows, saved as xgboost.json."""
    import xgboost

    rows = sample_rows(FOREST_TRAINING_ROWS, FOREST_FEATURES)
    noise = np.random.default_rng(SEED + 1).standard_normal(FOREST_TRAINING_ROWS)
    labels = (rows[:, :8].sum(axis=1) + noise > 0).astype(np.float32)
    booster = xgboost.train({"objective": "binary:logistic", "max_depth": FOREST_DEPTH, "eta": 0.1, "seed": SEED},
                            xgboost.DMatrix(rows, label=labels), num_boost_round=args.trees)
    version_dir.mkdir(parents=True)
    booster.save_model(version_dir / "xgboost.json")
    return (f"XGBoost binary classifier, {args.trees} trees of depth <= {FOREST_DEPTH}, "
            f"FP32 [N, {FOREST_FEATURES}] -> probabilities [N, 2], backend fil (Treelite GTIL)")


def forest_floors(version_dir: Path, seconds: float) -> list[Floor]:
    """XGBoost's own predictors and Treelite's GTIL (what the fil backend runs), all threads, as the backend."""
    import treelite
    import xgboost

    path = version_dir / "xgboost.json"
    booster = xgboost.Booster(model_file=path)
    forest = treelite.frontend.load_xgboost_model(path, format_choice="json")
    one, sixteen = sample_rows(1, FOREST_FEATURES), sample_rows(16, FOREST_FEATURES)
    return [
        Floor("xgboost inplace_predict b1", 1, rows_per_sec(lambda: booster.inplace_predict(one), 1, seconds)),
        Floor("xgboost predict(DMatrix) b1", 1,
              rows_per_sec(lambda: booster.predict(xgboost.DMatrix(one)), 1, seconds)),
        Floor("gtil b1", 1, rows_per_sec(lambda: treelite.gtil.predict(forest, one, nthread=-1), 1, seconds)),
        Floor("gtil b16", 16, rows_per_sec(lambda: treelite.gtil.predict(forest, sixteen, nthread=-1), 16, seconds)),
    ]


MLP_CONFIG = f"""name: "mlp"
backend: "onnxruntime"
max_batch_size: {MAX_BATCH_SIZE}
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [{MLP_FEATURES}] }}]
output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [{MLP_OUTPUTS}] }}]
instance_group [{{ kind: KIND_CPU count: 1 }}]
"""

FOREST_CONFIG = f"""name: "forest"
backend: "fil"
max_batch_size: {MAX_BATCH_SIZE}
input [{{ name: "input__0" data_type: TYPE_FP32 dims: [{FOREST_FEATURES}] }}]
output [{{ name: "output__0" data_type: TYPE_FP32 dims: [2] }}]
instance_group [{{ kind: KIND_CPU count: 1 }}]
parameters [
  {{ key: "model_type" value: {{ string_value: "xgboost_json" }} }},
  {{ key: "output_class" value: {{ string_value: "true" }} }},
  {{ key: "predict_proba" value: {{ string_value: "true" }} }}
]
"""

FRAMEWORKS = {
    "onnx": Framework("mlp", write_mlp, MLP_CONFIG, mlp_floors, ("plain", "batched")),
    "xgboost": Framework("forest", write_forest, FOREST_CONFIG, forest_floors, ("batched",)),
}


def write_repositories(framework: Framework, args: argparse.Namespace, scratch: Path) -> tuple[str, dict[str, Path]]:
    """The model in two repositories: as configured ("plain") and with ``dynamic_batching`` ("batched")."""
    plain, batched = scratch / "plain", scratch / "batched"
    description = framework.write(plain / framework.model / "1", args)
    (plain / framework.model / "config.pbtxt").write_text(framework.config)
    shutil.copytree(plain, batched)
    delay = f"dynamic_batching {{ max_queue_delay_microseconds: {args.max_queue_delay_us} }}\n"
    (batched / framework.model / "config.pbtxt").write_text(framework.config + delay)
    return description, {"plain": plain, "batched": batched}


def fmt_fraction(result: Result, floor: Floor) -> str:
    if result.infer_per_sec is None:
        return "-"
    return f"{'~' if result.status == 'unstable' else ''}{result.infer_per_sec / floor.rows_per_sec:.2g}"


def markdown(header: str, floors: list[Floor], results: list[Result]) -> str:
    lines = [header, "", "| in-process floor | rows per call | rows/s | µs per call |", "|---|---|---|---|"]
    for f in floors:
        call_us = 1e6 * f.rows_per_call / f.rows_per_sec
        lines.append(f"| {f.label} | {f.rows_per_call} | {f.rows_per_sec:,.0f} | {call_us:,.1f} |")
    columns = ["served (1 row per request)", "infer/s", "p50 / p99 (µs)", *(f"÷ {f.label}" for f in floors)]
    lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in results:
        cells = [f"{r.variant} {r.protocol} c={r.concurrency}", fmt_rate(r), fmt_latency(r),
                 *(fmt_fraction(r, f) for f in floors)]
        lines.append("| " + " | ".join(cells) + " |")
    if any(r.status == "unstable" for r in results):
        lines += ["", "`~`: perf_analyzer found no stable measurement; the figure is indicative only."]
    notes = [f"- {r.variant} {r.protocol} c={r.concurrency}: {r.status}: {r.detail}" for r in results if r.detail]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def bench_framework(name: str, args: argparse.Namespace, started: datetime) -> bool:
    """Build, measure the floors, serve each variant under perf_analyzer, write the report; True if no error."""
    framework = FRAMEWORKS[name]
    stem = f"{name}-{started:%Y%m%d-%H%M%S}"
    load = os.getloadavg()[0]
    variants = args.variants or framework.variants
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as scratch:
        description, repositories = write_repositories(framework, args, Path(scratch))
        print(f"{name}: {description}\n  in-process floors, {args.floor_seconds:g} s each ...", flush=True)
        floors = framework.floors(repositories["plain"] / framework.model / "1", args.floor_seconds)
        for variant in variants:
            run = argparse.Namespace(**vars(args), model=framework.model, variant=variant)
            results += bench_servers(["ours"], run, stem, repositories[variant])
    header = (f"## {name}: {description}\n\n"
              f"{started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, load average {load:.2f} at start, "
              f"{platform.platform()}. Served by triton-serve (one CPU instance, `max_batch_size: {MAX_BATCH_SIZE}`, "
              f"batched: `max_queue_delay_microseconds: {args.max_queue_delay_us}`) under perf_analyzer "
              f"({args.measurement_interval} ms windows, up to {args.max_trials} trials, "
              f"{args.stability_percentage}% stability, batch 1); floors: {args.floor_seconds:g} s each, "
              f"in this process, before the server starts.")
    table = markdown(header, floors, results)
    settings = {**{k: v for k, v in vars(args).items() if k != "frameworks"}, "variants": list(variants)}
    (RESULTS / f"{stem}.md").write_text(table)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"started": started.isoformat(timespec="seconds"), "framework": name, "model": description,
         "settings": settings, "machine": platform.platform(), "cpus": os.cpu_count(), "load_average": load,
         "floors": [asdict(f) for f in floors],
         "results": [{**asdict(r), "fraction_of_floor": {f.label: r.infer_per_sec / f.rows_per_sec for f in floors}
                      if r.infer_per_sec else {}} for r in results]}, indent=2) + "\n")
    print("\n" + table + f"\nwritten: {RESULTS / stem}.md and .json\n", flush=True)
    return all(r.status != "error" for r in results)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frameworks", nargs="+", choices=list(FRAMEWORKS), default=list(FRAMEWORKS))
    parser.add_argument("--protocols", nargs="+", choices=list(PROTOCOLS), default=["grpc", "http-binary"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--variants", nargs="+", choices=["plain", "batched"],
                        help="default: plain and batched for onnx, batched for xgboost")
    parser.add_argument("--max-queue-delay-us", type=int, default=0,
                        help="max_queue_delay_microseconds of the batched variant")
    parser.add_argument("--trees", type=int, default=300, help="boosting rounds of the XGBoost model")
    parser.add_argument("--floor-seconds", type=float, default=3, help="seconds per in-process floor")
    parser.add_argument("--measurement-interval", type=int, default=3000, help="ms per measurement window")
    parser.add_argument("--max-trials", type=int, default=8)
    parser.add_argument("--stability-percentage", type=int, default=10)
    parser.add_argument("--attempts", type=int, default=2, help="perf_analyzer runs per config while unstable")
    parser.add_argument("--start-timeout", type=float, default=120, help="seconds for the server to get ready")
    args = parser.parse_args()
    if args.attempts < 1:
        parser.error("--attempts must be at least 1")
    if subprocess.run([str(PERF_ANALYZER), "--version"], check=False, capture_output=True).returncode != 0:
        parser.error(f"{PERF_ANALYZER} does not run; run scripts/install.sh first")
    return args


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so that a running server is stopped
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = datetime.now()
    ok = [bench_framework(name, args, started) for name in args.frameworks]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the server was stopped on the way out
        sys.exit(130)
