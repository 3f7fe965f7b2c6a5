"""Inference functions importable by name, for the process-isolation tests."""
from __future__ import annotations

import os

import numpy as np

from triton_serve_pytriton.decorators import batch


@batch
def process_id(value: np.ndarray) -> dict[str, np.ndarray]:
    """Each row: the id of the process that ran the function."""
    return {"pid": np.full((value.shape[0], 1), os.getpid(), dtype=np.int64)}


def countdown(requests: list) -> object:
    """Decoupled: one response per number from the request's value down to 1."""
    start = int(requests[0]["value"].ravel()[0])
    for number in range(start, 0, -1):
        yield [{"pid": np.array([[number]], dtype=np.int64)} for _ in requests]
