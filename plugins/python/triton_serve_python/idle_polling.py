"""The worker polls for its next batch at the scheduler's idle priority (Linux's ``SCHED_IDLE``).

A CPU whose only running thread is an idle-priority one counts as free: the kernel places the processes it wakes
there (the server, its clients) and lets them preempt the poller at once. So a poll keeps the worker awake for
the next batch (no wake-up of a sleeping process) without taking a CPU from anyone: at the dynamic batcher's
c=4, where one batch at a time leaves the worker polling most of the time, polling at normal priority cost the
server a fifth of its throughput.

Where other processes keep every CPU busy, an idle-priority poller gets its CPU late, and with it the batch that
came meanwhile. Two polls in a row that find their batch right after ``STARVED_S`` or more off their CPU make the
worker poll at normal priority for ``NORMAL_FOR_S``, then try again. One such poll alone is the server's own work
on a busy machine (at c=16 a few in a thousand polls; beside CPU-bound processes, most of them): polling at normal
priority then would take the CPU the server needs.

Linux lets a thread leave ``SCHED_IDLE`` only with ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` that allows its nice
value; ``IdlePriority.probed()`` tries it on a thread of its own first, and without it the worker polls as before.
"""
from __future__ import annotations

import os
import threading

STARVED_S = 0.002  # a gap this long between two polls: the poller was off its CPU for more than a slice or two
NORMAL_FOR_S = 1.0  # after two such gaps in a row, how long the worker polls at normal priority


def _may_leave_idle_priority() -> bool:
    """Whether a thread of this process runs under the normal policy and may go to ``SCHED_IDLE`` and back."""
    try:
        if not hasattr(os, "SCHED_IDLE") or os.sched_getscheduler(0) != os.SCHED_OTHER:
            return False
    except OSError:  # a sandbox that refuses scheduler calls
        return False
    returned: list[bool] = []

    def go_and_return() -> None:  # a thread of its own: if it cannot return, it ends at idle priority
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            return
        returned.append(True)

    probe = threading.Thread(target=go_and_return, name="idle-priority probe")
    probe.start()
    probe.join()
    return bool(returned)


class IdlePriority:
    """Switches the calling thread to idle priority for a poll, unless two polls in a row were starved lately."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._normal_until = 0.0  # perf_counter time until which polls stay at normal priority
        self._starved = False  # whether the last idle-priority poll that found its batch found it late

    @classmethod
    def probed(cls) -> IdlePriority:
        """Enabled where this process may leave idle priority again."""
        return cls(_may_leave_idle_priority())

    def enter(self, now: float) -> bool:
        """Go to idle priority for the poll starting at ``now``; whether it did."""
        if not self.enabled or now < self._normal_until:
            return False
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:  # refused after all: poll at normal priority from now on
            self.enabled = False
            return False
        return True

    def leave(self, starved: bool | None, now: float) -> None:
        """Back to normal priority; ``starved``: whether the poll's bytes came while it was off its CPU too long
        (None: the poll found none)."""
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        if starved is None:
            return
        if starved and self._starved:
            self._normal_until = now + NORMAL_FOR_S
            starved = False  # the next late poll, after this time, counts as the first again
        self._starved = starved
