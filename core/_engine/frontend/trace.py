"""A front-end's part of a request's trace: its timestamps and the caller's trace context, kept in the process
that received the request (a front-end process, or the owner) and handed to the owner's trace if it is sampled."""
from __future__ import annotations

import time
from collections.abc import Callable

TRACEPARENT = "traceparent"  # the W3C trace context header (HTTP) or metadata key (gRPC)
Stamps = list[tuple[str, int]]  # (timestamp name, steady-clock ns), as time.monotonic_ns() gives them


class FrontendTrace:
    """A front-end's part of one request's trace, kept while tracing is armed: its timestamps and the
    caller's ``traceparent``. If the model owner samples the request, it gives the function that takes
    the timestamps (``report_to``); they go once the front-end is done (``finish``)."""

    __slots__ = ("parent", "stamps", "finished", "_report")

    def __init__(self, parent: str | None, first: str | None = None) -> None:
        self.parent = parent or None
        self.stamps: Stamps = [(first, time.monotonic_ns())] if first else []
        self.finished = False
        self._report: Callable[[Stamps], None] | None = None

    def stamp(self, name: str) -> None:
        self.stamps.append((name, time.monotonic_ns()))

    def finish(self, last: str | None = None) -> None:
        """The front-end is done with the request (a cancelled one too): stamp ``last``, report if sampled."""
        if not self.finished:
            self.finished = True
            if last:
                self.stamp(last)
            self._deliver()

    def report_to(self, report: Callable[[Stamps], None]) -> None:
        """The request is traced: ``report`` takes the stamps once the front-end is done (at once if it is:
        a front-end process learns this after the response, which a cancelled request may not wait for)."""
        self._report = report
        if self.finished:
            self._deliver()

    def _deliver(self) -> None:
        report, self._report = self._report, None
        if report is not None:
            report(self.stamps)
