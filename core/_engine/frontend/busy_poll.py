"""Busy polling after an answer (``--busy-poll-microseconds``).

A client that waits for its answer usually sends its next request soon after it. An event loop with nothing to do
sleeps in its wait for I/O, and the request that comes then has to wake it: on a virtual machine whose idle vCPUs
halt, a wake-up costs a round trip through the host, tens of µs (bench/README.md). So once an answer is written,
the loop keeps turning for a while, its waits for I/O taking no time, and reads the next request as it arrives.
A loop with other work turns anyway; this costs it one callback per turn.

How long is learnt (``PollWindow``): four times the usual wait from an answer to the next request, within
the configured time.
"""
from __future__ import annotations

import asyncio
import time

from ..poll_window import PollWindow

DEFAULT_MICROSECONDS = 1000


class BusyPoll:
    """Keeps one event loop turning after each ``answered()`` for four times the usual wait for the next request,
    measured by ``arrived()``, bounded by ``microseconds`` (0: never)."""

    __slots__ = ("_loop", "window", "_until", "_turning")

    def __init__(self, loop: asyncio.AbstractEventLoop, microseconds: int) -> None:
        self._loop = loop
        self.window = PollWindow(microseconds / 1e6)  # learns the wait from an answer to the next request
        self._until = 0.0
        self._turning = False

    def arrived(self) -> None:
        """A request arrived: learn how long after the last answer."""
        self.window.came()

    def answered(self) -> None:
        """An answer went out: poll for the next request for ``window.seconds`` from now."""
        if self.window.limit_s:
            now = time.perf_counter()
            self.window.wait_began(now)
            window = self.window.seconds
            if window and now + window > self._until:
                self._until = now + window
                if not self._turning:
                    self._turning = True
                    self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        if time.perf_counter() < self._until:
            self._loop.call_soon(self._turn)
        else:
            self._turning = False
