"""The worker polls for its next batch at idle priority where it may, and at normal priority after a starved poll."""
from __future__ import annotations

import os
import socket

import pytest

from triton_serve_python import idle_polling, protocol
from triton_serve_python.idle_polling import NORMAL_FOR_S, STARVED_S, IdlePriority
from triton_serve_python.protocol import BlockingChannel, Kind, encode

MAY_LEAVE_IDLE = IdlePriority.probed().enabled
needs_idle_priority = pytest.mark.skipif(not MAY_LEAVE_IDLE, reason="this process may not leave SCHED_IDLE")


class _PolicySocket:
    """A socket end that records the calling thread's scheduling policy at each non-blocking ``recv``; the frame
    ``ready_after`` such reads is sent to it just before the next one."""

    def __init__(self, sock: socket.socket, server_end: socket.socket, frame: bytes, ready_after: int) -> None:
        self._sock, self._server_end, self._frame, self._ready_after = sock, server_end, frame, ready_after
        self.policies: list[int] = []

    def recv(self, size: int, flags: int = 0) -> bytes:
        if flags & socket.MSG_DONTWAIT:
            self.policies.append(os.sched_getscheduler(0))
            if len(self.policies) == self._ready_after + 1:
                self._server_end.sendall(self._frame)
        return self._sock.recv(size, flags)


def _poll_once(channel: BlockingChannel, server_end: socket.socket, worker_end: socket.socket) -> list[int]:
    """One hinted read whose frame comes on its fourth poll: the policies its polls ran under."""
    recorder = _PolicySocket(worker_end, server_end, encode(Kind.IS_READY), ready_after=3)
    channel._sock = recorder  # type: ignore[assignment]
    channel._next_batch.usual_s = 1.0  # as if batches had come a second after the answers: polls 4 s at most
    channel.poll_next_s = 5.0
    assert channel.receive() == (Kind.IS_READY, None)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # back to normal once read
    return recorder.policies


def test_polls_run_at_idle_priority_where_the_process_may_return_and_at_normal_priority_elsewhere() -> None:
    server_end, worker_end = socket.socketpair()
    try:
        channel = BlockingChannel(worker_end, IdlePriority.probed())
        policies = _poll_once(channel, server_end, worker_end)
        assert len(policies) == 4
        expected = os.SCHED_IDLE if MAY_LEAVE_IDLE else os.SCHED_OTHER
        assert set(policies) == {expected}
        plain = BlockingChannel(worker_end)  # no IdlePriority given: polls at normal priority
        assert set(_poll_once(plain, server_end, worker_end)) == {os.SCHED_OTHER}
    finally:
        server_end.close()
        worker_end.close()


class _Clock:
    """``time.perf_counter`` for the channel: a µs per call, and ``off_cpu_s`` more at the second call of a read
    (the poll's first look at the socket, after the poller was off its CPU that long)."""

    def __init__(self) -> None:
        self.now, self.calls, self.off_cpu_s = 1000.0, 0, 0.0

    def __call__(self) -> float:
        self.calls += 1
        self.now += 1e-6 + (self.off_cpu_s if self.calls == 2 else 0.0)
        return self.now


class _PolicyRecorder:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.policies: list[int] = []

    def recv(self, size: int, flags: int = 0) -> bytes:
        self.policies.append(os.sched_getscheduler(0))
        return self._sock.recv(size, flags)


@needs_idle_priority
def test_two_polls_in_a_row_whose_batch_came_while_they_were_off_their_cpu_make_the_next_polls_normal_for_a_while(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(protocol.time, "perf_counter", clock)
    server_end, worker_end = socket.socketpair()
    recorder = _PolicyRecorder(worker_end)
    channel = BlockingChannel(recorder, IdlePriority(True))  # type: ignore[arg-type]

    def hinted_read(off_cpu_s: float) -> list[int]:
        """The policy of each read of a frame already waiting, found by a poll that was off its CPU that long."""
        recorder.policies.clear()
        clock.calls, clock.off_cpu_s = 0, off_cpu_s
        server_end.sendall(encode(Kind.IS_READY))
        channel.poll_next_s = 5.0
        assert channel.receive() == (Kind.IS_READY, None)
        return recorder.policies

    try:
        assert hinted_read(0.0) == [os.SCHED_IDLE]  # on time: idle priority, and it stays so
        assert hinted_read(STARVED_S / 2) == [os.SCHED_IDLE]  # a short preemption is what idle priority is for
        assert hinted_read(STARVED_S * 4) == [os.SCHED_IDLE]  # the batch waited while the poller was off its CPU
        assert hinted_read(0.0) == [os.SCHED_IDLE]  # once: the server's own work, and the next poll was on time
        assert hinted_read(STARVED_S * 4) == [os.SCHED_IDLE]
        assert hinted_read(STARVED_S * 4) == [os.SCHED_IDLE]  # twice in a row: other processes hold the CPUs
        assert hinted_read(0.0) == [os.SCHED_OTHER]  # so the next polls run at normal priority
        clock.now += NORMAL_FOR_S / 2
        assert hinted_read(0.0) == [os.SCHED_OTHER]
        clock.now += NORMAL_FOR_S
        assert hinted_read(0.0) == [os.SCHED_IDLE]  # then at idle priority again
        assert hinted_read(STARVED_S * 4) == [os.SCHED_IDLE]  # and a late poll counts as the first again
        assert hinted_read(0.0) == [os.SCHED_IDLE]
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    finally:
        server_end.close()
        worker_end.close()


def test_the_probe_leaves_the_calling_thread_under_its_own_policy() -> None:
    before = os.sched_getscheduler(0)
    IdlePriority.probed()
    assert os.sched_getscheduler(0) == before
    assert idle_polling._may_leave_idle_priority() is MAY_LEAVE_IDLE


@needs_idle_priority
def test_a_poll_that_fails_leaves_the_thread_at_normal_priority() -> None:
    class _Resetting:
        def recv(self, size: int, flags: int = 0) -> bytes:
            assert os.sched_getscheduler(0) == os.SCHED_IDLE
            raise ConnectionResetError("the server went away")

    channel = BlockingChannel(_Resetting(), IdlePriority(True))  # type: ignore[arg-type]
    channel.poll_next_s = 5.0
    with pytest.raises(ConnectionResetError):
        channel.receive()
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_where_scheduler_calls_are_refused_the_worker_polls_at_normal_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object) -> None:
        raise PermissionError("not here")

    monkeypatch.setattr(idle_polling.os, "sched_getscheduler", refuse)
    assert not IdlePriority.probed().enabled
    monkeypatch.setattr(idle_polling.os, "sched_setscheduler", refuse)
    refused_later = IdlePriority(True)
    assert refused_later.enter(0.0) is False and not refused_later.enabled
