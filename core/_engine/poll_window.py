"""How long to busy-poll for what usually comes soon (a client's next request, a worker's answer or next batch).

Polling instead of sleeping saves the wake-up of a sleeping process (tens of µs on a virtual machine whose idle
CPUs halt), and costs CPU time while nothing comes. So every poller learns how long it usually waits and polls
for four times that: a slower machine or client is polled for longer, queued work (short waits) briefly, and
what usually comes later than the configured limit not at all.
"""
from __future__ import annotations

FLOOR_S = 50e-6  # the shortest poll: what a poller that has learnt no wait yet polls for


class PollWindow:
    """The usual wait for something (a moving average, weight 1/8, of what ``learn`` is told) and the window to
    poll for it: four times that wait, at least ``FLOOR_S``, at most ``limit_s``; 0 (do not poll) where the
    usual wait is longer than ``limit_s``, or ``limit_s`` is 0. One wait counts as at most twice ``limit_s``, so
    a long absence moves the average by a quarter of the limit, and polling resumes a few short waits later."""

    __slots__ = ("limit_s", "usual_s")

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.usual_s = 0.0

    def learn(self, waited_s: float) -> None:
        """It came ``waited_s`` seconds after the poll (or the sleep) for it began."""
        self.usual_s += (min(waited_s, 2 * self.limit_s) - self.usual_s) / 8

    @property
    def seconds(self) -> float:
        """How long to poll for it next time (0: not at all)."""
        limit = self.limit_s
        if not limit or self.usual_s > limit:
            return 0.0
        return min(max(4 * self.usual_s, FLOOR_S), limit)
