"""Which GPUs this process may use, found without importing any framework."""
from __future__ import annotations

import os
import re
from pathlib import Path


def visible_gpu_ids() -> list[int]:
    """GPU indices visible to frameworks here: the NVIDIA devices present, limited by
    ``CUDA_VISIBLE_DEVICES`` when it is set (indices then count from 0, as CUDA renumbers them)."""
    present = _present_gpu_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(present))
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    usable = []
    for entry in entries:
        if entry.startswith("-"):
            break  # CUDA stops at the first invalid id
        usable.append(entry)
    return list(range(min(len(usable), present)))


def _present_gpu_count() -> int:
    driver = Path("/proc/driver/nvidia/gpus")
    if driver.is_dir():
        return sum(1 for _ in driver.iterdir())
    return sum(1 for path in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", path.name))
