"""How long to busy-poll for what usually comes soon (a client's next request, a worker's answer or next batch).

Polling instead of sleeping saves the wake-up of a sleeping process (tens of µs on a virtual machine whose idle
CPUs halt), and costs CPU time while nothing comes. So every poller learns how long it usually waits and polls
for four times that: a slower machine or client is polled for longer, queued work (short waits) briefly, and
what usually comes later than the configured limit not at all.
"""
from __future__ import annotations

import time

FLOOR_S = 50e-6  # the shortest poll: what a poller that has learnt no wait yet polls for


class PollWindow:
    """The usual wait for something (a moving average, weight 1/8, of what ``learn`` is told) and the window to
    poll for it: four times that wait, at least ``FLOOR_S``, at most ``limit_s``; 0 (do not poll) where the
    usual wait is longer than ``limit_s``, or ``limit_s`` is 0. One wait counts as at most twice ``limit_s``, so
    a long absence moves the average by a quarter of the limit, and polling resumes a few short waits later."""

    __slots__ = ("limit_s", "usual_s", "_since")

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.usual_s = 0.0
        self._since = 0.0  # when the wait being timed began (``time.perf_counter``); 0: none

    def learn(self, waited_s: float) -> None:
        """It came ``waited_s`` seconds after the poll (or the sleep) for it began."""
        self.usual_s += (min(waited_s, 2 * self.limit_s) - self.usual_s) / 8

    def wait_began(self, now: float) -> None:
        """A wait to learn from began at ``now`` (``time.perf_counter``); ``came`` ends it."""
        self._since = now

    def came(self) -> None:
        """What was waited for came: learn how long the wait begun by ``wait_began`` took (nothing if none was)."""
        if self._since:
            self.learn(time.perf_counter() - self._since)
            self._since = 0.0

    @property
    def seconds(self) -> float:
        """How long to poll for it next time (0: not at all)."""
        limit = self.limit_s
        if not limit or self.usual_s > limit:
            return 0.0
        return min(max(4 * self.usual_s, FLOOR_S), limit)
