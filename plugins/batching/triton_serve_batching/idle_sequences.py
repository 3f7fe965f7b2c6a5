"""``max_sequence_idle_microseconds``: a sequence that sends no request for that long is released."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from .correlation import CorrelationId

DEFAULT_MAX_SEQUENCE_IDLE_US = 1_000_000
BACKLOG_RECHECK_NS = 50_000_000  # how often an idle sequence still in the backlog is looked at again


class IdleSequenceTimer:
    """Notes when each sequence was last heard from and, while ``run`` runs, calls ``expire(corrid)``
    for those silent for ``idle_ns``. ``expire`` releases the sequence (or finds it ended already)
    and returns True, or returns False while the sequence waits in the backlog: its turn to expire
    comes once it holds a slot."""

    def __init__(self, idle_ns: int, expire: Callable[[CorrelationId], bool]) -> None:
        self.idle_ns = idle_ns
        self._expire = expire
        self._last_seen: dict[CorrelationId, int] = {}

    def seen(self, corrid: CorrelationId) -> None:
        """A request of sequence ``corrid`` arrived now."""
        self._last_seen[corrid] = time.monotonic_ns()

    async def run(self) -> None:
        """Expire idle sequences until cancelled."""
        while True:
            await asyncio.sleep(self._expire_idle(time.monotonic_ns()) / 1e9)

    def _expire_idle(self, now_ns: int) -> int:
        """Expire the sequences idle at ``now_ns``; how long until one may be next, in nanoseconds."""
        sleep_ns = self.idle_ns
        for corrid, seen in list(self._last_seen.items()):
            remaining = seen + self.idle_ns - now_ns
            if remaining <= 0 and self._expire(corrid):
                del self._last_seen[corrid]
            else:
                sleep_ns = min(sleep_ns, remaining if remaining > 0 else BACKLOG_RECHECK_NS)
        return sleep_ns
