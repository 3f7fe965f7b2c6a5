"""Writes the winning configuration: the user's config.pbtxt with the chosen fields, and how it was chosen."""
from __future__ import annotations

import datetime
import shutil
from pathlib import Path
from typing import Any

from .measure import Measurement
from .space import Candidate, apply_to_proto, parse_pbtxt, proto_from_json, to_pbtxt

# Triton's custom-configuration location: <model>/configs/<name>.pbtxt, served with --model-config-name.
CONFIG_NAME = "analyzed"


def write_config(model: str, model_dir: Path | None, output_repository: Path | None, fallback_dir: Path,
                 served: dict[str, Any], candidate: Candidate, measurement: Measurement, how: str) -> Path:
    """Write the winner; return its path.

    With ``output_repository``: ``<output>/<model>/config.pbtxt`` beside a copy of the model's files.
    Else, for a model in a local repository: ``<model_dir>/configs/analyzed.pbtxt`` (the original
    config.pbtxt is left as it is; ``--model-config-name analyzed`` serves the new one). Else (the
    repository is not local): ``<fallback_dir>/<model>/config.pbtxt``.
    """
    original = model_dir / "config.pbtxt" if model_dir is not None else None
    if original is not None and original.is_file():
        base = parse_pbtxt(original.read_text())
    else:
        base = proto_from_json(served)
    chosen = apply_to_proto(base, candidate, served)
    stamp = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    header = (f"# Chosen by `triton-serve analyze` on {stamp}: {candidate.key}.\n"
              f"# {how}\n"
              f"# Measured {measurement.throughput:,.0f} infer/s at p99 {measurement.p99_ms:.2f} ms "
              f"(perf_analyzer, concurrency {measurement.concurrency}, batch size {measurement.batch_size}).\n")
    if output_repository is not None:
        target_dir = output_repository / model
        if model_dir is not None and model_dir.is_dir() and not target_dir.exists():
            shutil.copytree(model_dir, target_dir, ignore=shutil.ignore_patterns("configs", "config.pbtxt"))
        target = target_dir / "config.pbtxt"
    elif model_dir is not None and model_dir.is_dir():
        target = model_dir / "configs" / f"{CONFIG_NAME}.pbtxt"
    else:
        target = fallback_dir / model / "config.pbtxt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(header + to_pbtxt(chosen))
    return target
