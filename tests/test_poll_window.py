"""The one rule every busy poller learns its window by (``triton_serve.worker.PollWindow``): four times the usual
wait, within a floor and the configured limit, none where the usual wait exceeds the limit, and a long absence
counted as twice the limit."""
from __future__ import annotations

import time

import pytest

from triton_serve.worker import PollWindow

FLOOR_S = 50e-6


def _learn(window: PollWindow, wait_s: float, times: int) -> None:
    for _ in range(times):
        window.learn(wait_s)


def test_the_window_follows_the_usual_wait_within_its_bounds() -> None:
    window = PollWindow(1e-3)
    assert window.seconds == FLOOR_S  # nothing learnt yet
    _learn(window, 1e-6, 100)  # what it waits for is already there: the shortest poll
    assert window.seconds == FLOOR_S
    _learn(window, 150e-6, 100)  # a slower machine or client: polled for longer
    assert window.seconds == pytest.approx(600e-6, rel=0.01)
    _learn(window, 400e-6, 100)  # four times the wait would be 1.6 ms: the 1 ms limit bounds it
    assert window.seconds == pytest.approx(1e-3)
    _learn(window, 1.5e-3, 100)  # it comes later than polling may wait: no polling
    assert window.seconds == 0
    _learn(window, 100e-6, 50)  # back to quick arrivals: polling again
    assert window.seconds == pytest.approx(400e-6, rel=0.05)


def test_an_absence_counts_as_twice_the_limit_so_polling_soon_resumes() -> None:
    window = PollWindow(1e-3)
    _learn(window, 100e-6, 100)
    window.learn(60.0)  # a minute with nothing
    assert window.usual_s == pytest.approx(100e-6 + (2e-3 - 100e-6) / 8)
    assert window.seconds == pytest.approx(1e-3)
    _learn(window, 100e-6, 20)
    assert window.seconds == pytest.approx(400e-6, rel=0.2)


def test_a_limit_of_zero_never_polls() -> None:
    window = PollWindow(0.0)
    _learn(window, 1e-6, 10)
    assert window.seconds == 0


def test_a_timed_wait_is_learnt_once_and_only_when_one_began() -> None:
    window = PollWindow(1.0)
    window.came()  # nothing was waited for: nothing learnt
    assert window.usual_s == 0
    window.wait_began(time.perf_counter() - 0.08)  # began 80 ms ago
    window.came()
    assert window.usual_s >= 0.08 / 8
    learnt = window.usual_s
    window.came()  # the same arrival told twice, or one no wait preceded: counted once
    assert window.usual_s == learnt
