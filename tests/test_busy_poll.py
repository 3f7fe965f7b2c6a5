"""Busy polling after an answer (``--busy-poll-microseconds``): the loop keeps turning for its window after the last
answer and then stops; the window is learnt from the waits between an answer and the next request (its rule:
test_poll_window.py); every request and answer over HTTP and gRPC is told to the poller of the process that serves
the client, and a front-end process gets the setting."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_serve._engine.frontend import busy_poll
from triton_serve._engine.frontend.busy_poll import BusyPoll
from triton_serve._engine.cli import build_parser, options_from_args
from triton_serve._engine.frontend.frontends import FrontendOptions

from .conftest import ADD_SUB


class _Loop:
    """As much of an event loop as BusyPoll uses: callbacks wait in ``ready`` until the test runs them."""

    def __init__(self) -> None:
        self.ready: list[Callable[[], None]] = []

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.ready.append(callback)

    def turn(self) -> None:
        ready, self.ready = self.ready, []
        for callback in ready:
            callback()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """busy_poll's clock, in seconds, set by the test."""
    now = [100.0]
    monkeypatch.setattr(busy_poll.time, "perf_counter", lambda: now[0])
    return now


def _learn(poll: BusyPoll, clock: list[float], wait_s: float, times: int) -> None:
    """``times`` answers, each followed by a request ``wait_s`` later."""
    for _ in range(times):
        poll.answered()
        clock[0] += wait_s
        poll.arrived()


def test_the_loop_turns_until_the_window_after_the_last_answer_and_then_stops(clock: list[float]) -> None:
    loop = _Loop()
    poll = BusyPoll(loop, 1000)  # type: ignore[arg-type]
    _learn(poll, clock, 50e-6, 100)  # requests come 50 µs after their answers: poll for 200 µs
    clock[0] += 1e-3
    loop.turn()
    assert loop.ready == []  # the polls of the learning are over
    assert poll.window.seconds == pytest.approx(200e-6, rel=1e-3)
    poll.answered()
    for _ in range(3):
        assert len(loop.ready) == 1  # one turn queued: the loop does not sleep
        loop.turn()
    clock[0] += 150e-6
    poll.answered()  # a second answer while polling: the same chain, polling until 200 µs from now
    assert len(loop.ready) == 1
    clock[0] += 150e-6
    loop.turn()
    assert len(loop.ready) == 1  # 300 µs after the first answer, 150 after the second
    clock[0] += 60e-6
    loop.turn()
    assert loop.ready == []  # past the window: the loop may sleep again
    poll.answered()  # the next answer polls again
    assert len(loop.ready) == 1


def test_a_request_without_an_answer_before_it_teaches_nothing(clock: list[float]) -> None:
    poll = BusyPoll(_Loop(), 1000)  # type: ignore[arg-type]
    _learn(poll, clock, 100e-6, 100)
    clock[0] += 5.0
    poll.arrived()  # a second request with no answer between: not a wait for the next request
    assert poll.window.seconds == pytest.approx(400e-6, rel=1e-3)


def test_zero_microseconds_never_polls(clock: list[float]) -> None:
    loop = _Loop()
    BusyPoll(loop, 0).answered()  # type: ignore[arg-type]
    assert loop.ready == []


def test_the_flag_reaches_every_front_end_and_is_checked() -> None:
    parser = build_parser()
    assert options_from_args(parser.parse_args([])).frontend_options().busy_poll_microseconds == 1000
    options = options_from_args(parser.parse_args(["--busy-poll-microseconds=0"])).frontend_options()
    assert options.busy_poll_microseconds == 0
    assert FrontendOptions.from_dict(options.to_dict()).busy_poll_microseconds == 0  # what a front-end process gets
    for bad in ("-1", "1000001", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args([f"--busy-poll-microseconds={bad}"])


def test_every_request_and_answer_is_told_to_the_poller(add_model, toy_server,  # type: ignore[no-untyped-def]
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The front-ends tell the poller of each HTTP and gRPC request and answer (a front-end process runs the same
    front-ends)."""
    told: list[tuple[str, Any]] = []
    monkeypatch.setattr(BusyPoll, "answered", lambda poll: told.append(("answered", poll)))
    monkeypatch.setattr(BusyPoll, "arrived", lambda poll: told.append(("arrived", poll)))
    add_model("add_sub", ADD_SUB)
    server = toy_server()
    data = np.arange(16, dtype=np.int32).reshape(1, 16)

    assert (_add_sub(httpclient, server.http_url, data) == 2 * data).all()
    assert [event for event, _ in told] == ["arrived", "answered"]
    assert (_add_sub(grpcclient, server.grpc_url, data) == 2 * data).all()
    assert [event for event, _ in told] == ["arrived", "answered"] * 2
    assert len({id(poll) for _, poll in told}) == 1  # one poller per process, whichever protocol answered


def _add_sub(client_module: Any, url: str, data: np.ndarray) -> np.ndarray:
    """OUTPUT0 of add_sub for ``data`` as both inputs, through tritonclient's ``http`` or ``grpc`` module."""
    client = client_module.InferenceServerClient(url)
    inputs = [client_module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    try:
        return client.infer("add_sub", inputs).as_numpy("OUTPUT0")
    finally:
        client.close()
