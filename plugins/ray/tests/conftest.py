"""Ray set-up for these tests (quiet, fast autoscaling metrics) and the example repository's path."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from triton_serve.testing import EXAMPLE_REPOSITORY

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # before ray is imported: no usage prompt or upload
# Replicas and handles report their load for autoscaling every half second (Ray's default: 10 s).
os.environ.setdefault("RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")

with warnings.catch_warnings():  # Ray's own modules use pydantic features pydantic 2 deprecates
    warnings.simplefilter("ignore", DeprecationWarning)
    import ray.serve  # noqa: F401


@pytest.fixture(scope="session")
def example_repository() -> Path:
    """The example repository: Python models (add_sub, identity_bytes, tokenizer, ...) and an ensemble."""
    return EXAMPLE_REPOSITORY
