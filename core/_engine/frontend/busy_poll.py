"""Busy polling after an answer (``--busy-poll-microseconds``).

A client that waits for its answer usually sends its next request soon after it. An event loop with nothing to do
sleeps in its wait for I/O, and the request that comes then has to wake it: on a virtual machine whose idle vCPUs
halt, a wake-up costs a round trip through the host, tens of µs (bench/README.md). So once an answer is written,
the loop keeps turning for a short while, its waits for I/O taking no time, and reads the next request as it
arrives. A loop with other work turns anyway; this costs it one callback per turn.
"""
from __future__ import annotations

import asyncio
import time

DEFAULT_MICROSECONDS = 200


class BusyPoll:
    """Keeps one event loop turning until ``microseconds`` after the last ``answered()`` (0: never)."""

    __slots__ = ("_loop", "_seconds", "_until", "_turning")

    def __init__(self, loop: asyncio.AbstractEventLoop, microseconds: int) -> None:
        self._loop = loop
        self._seconds = microseconds / 1e6
        self._until = 0.0
        self._turning = False

    def answered(self) -> None:
        """An answer went out: poll for the next request for the configured time from now."""
        if self._seconds:
            self._until = time.perf_counter() + self._seconds
            if not self._turning:
                self._turning = True
                self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        if time.perf_counter() < self._until:
            self._loop.call_soon(self._turn)
        else:
            self._turning = False
