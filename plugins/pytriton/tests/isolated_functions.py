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


def not_a_list(requests: list) -> object:
    """Results that are not a list of dicts: the whole call is refused."""
    return {"pid": np.zeros((1, 1), np.int64)}


@batch
def wrong_type(value: np.ndarray) -> dict[str, np.ndarray]:
    """Text where a number is declared: that request fails, naming the output."""
    return {"pid": np.array([[b"x"]] * value.shape[0], dtype=object)}


@batch
def greeting(value: np.ndarray) -> dict[str, np.ndarray]:
    """A BYTES output: each row's value as text."""
    return {"text": np.array([[f"hello {int(row[0])}".encode()] for row in value], dtype=object)}


def with_a_note(requests: list) -> list[dict[str, object]]:
    """The declared output, and one the config does not declare (dropped) that pickle could not carry."""
    return [{"pid": np.full((request["value"].shape[0], 1), 7, dtype=np.int64), "note": lambda: "not an array"}
            for request in requests]
