"""Triton's batcher testing aid, ``TRITONSERVER_DELAY_SCHEDULER=N``: both batchers form no batch
until N requests have been queued, then behave normally."""
from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def delay_scheduler_count() -> int:
    """N from ``TRITONSERVER_DELAY_SCHEDULER`` (0, meaning no delay, when unset or not an integer)."""
    value = os.environ.get("TRITONSERVER_DELAY_SCHEDULER", "")
    try:
        return max(int(value), 0) if value else 0
    except ValueError:
        log.warning("ignoring TRITONSERVER_DELAY_SCHEDULER=%r: not an integer", value)
        return 0
