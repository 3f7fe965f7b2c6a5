"""The server's handle on one worker process: launch it, talk to it, notice when it exits, clean up after it."""
from __future__ import annotations

import asyncio
import logging
import re
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from triton_serve.plugin import (InferenceClient, InferenceRequest, InferenceResponse, PollWindow, ServerError, Status,
                                 TensorLayout, mark_inputs_ready, mark_outputs_ready)

from .arena import ALIGNMENT, Arena, grown_size
from .bls_calls import BlsCalls
from .metric_calls import WorkerMetrics
from .open_requests import OpenRequests
from .options import PythonBackendOptions
from .protocol import FrameDecoder, Kind, Message, encode
from .server_calls import WorkerCalls
from .transfer import describe_requests, read_responses

log = logging.getLogger("triton_serve_python")
model_log = logging.getLogger("triton_serve_python.model")
_LEVELS = {"INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR, "VERBOSE": logging.DEBUG}
_EOF_GRACE_S = 2.0  # a worker that closed its socket but is still running after this is killed
_READ_SIZE = 64 * 1024  # bytes read from a worker's socket at a time
# A batch whose inputs take at most this many bytes travels inside its EXECUTE frame, and its outputs inside the
# RESULT frame, so several such batches can be on their way to the worker at once (the worker runs them in
# order); a larger one goes through the arenas, alone.
INLINE_LIMIT = 64 * 1024
_ANSWERS = frozenset({Kind.STARTED, Kind.READY, Kind.FAILED, Kind.RESULT, Kind.FINALIZED, Kind.READINESS})
# The workers of this server process that owe an answer. A batch sent while none does is alone: nothing else
# wants the CPUs, so the server polls for its answer and the worker for the next batch (busy-poll-microseconds).
_OWING: set[WorkerProcess] = set()
_MODEL_LOCATION = re.compile(r"([^\s:\]]+):(\d+)\] (.*)", re.S)  # pb_utils.Logger's "model.py:12] message"


class WorkerFailure(Exception):
    """The worker exited, or was killed, before it answered; the text says how ("exited with code 3")."""


class WorkerStartFailed(ServerError):
    """The worker process died before it reported that it started (before any model code ran): starting
    another one may work (a process forked beside gRPC's threads can crash before it runs Python)."""


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _log_model_line(level: str, line: str) -> None:
    """Log a line from the worker as Triton logs a model's pb_utils.Logger line: at the model's file and line."""
    levelno = _LEVELS.get(level, logging.INFO)
    if not model_log.isEnabledFor(levelno):
        return
    located = _MODEL_LOCATION.fullmatch(line)
    if located is None:  # the worker's own line, not the model's
        model_log.log(levelno, "%s", line)
        return
    filename, lineno, message = located.groups()
    model_log.handle(model_log.makeRecord(model_log.name, levelno, filename, int(lineno), message, (), None))


class _WorkerConnection(asyncio.BufferedProtocol):
    """Feeds the messages arriving on the server's end of the socket to the WorkerProcess.

    It reads into one buffer of its own: asyncio's plain Protocol allocates 256 KiB per read and shrinks it,
    which glibc may serve with an mmap, mremap and munmap every time (it did, in bench/round_trip.py).
    """

    def __init__(self, worker: WorkerProcess) -> None:
        self._worker = worker
        self._decoder = FrameDecoder()
        self._buffer = memoryview(bytearray(_READ_SIZE))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        for kind, body in self._decoder.feed(self._buffer[:nbytes].tobytes()):
            self._worker._on_message(kind, body)

    def connection_lost(self, exc: Exception | None) -> None:
        self._worker._on_disconnect()


class WorkerProcess:
    """One worker process serving one model instance, with its socket and its two shared-memory arenas.

    ``start`` launches it and initializes the model; ``execute`` sends it a batch and waits for the batch's
    result: small batches travel inside the frames and may be sent while earlier ones are still running (the
    worker runs them in order and answers in order), a batch with larger inputs goes through the arenas once
    nothing else is on its way; ``stop`` finalizes it. If it exits by itself or is killed (a crash,
    ``os._exit``, an execute timeout) after starting, ``on_exit`` is called with how it ended, its arenas are
    released, its BLS calls are cancelled, and the batches and the requests it still had to answer through
    response senders fail. Runs on the server's event loop.
    """

    def __init__(self, label: str, options: PythonBackendOptions, on_exit: Callable[[str], None],
                 client: InferenceClient | None = None) -> None:
        self.label = label  # "instance 'm_0_0' of python model 'm'"
        self.options = options
        self._on_exit = on_exit
        self._arenas: dict[str, Arena] = {}
        self._process: asyncio.subprocess.Process | None = None
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()  # kept: each asyncio.get_running_loop() costs a getpid() system call
        self._outgoing: list[bytes] = []  # frames written during this event-loop turn, sent at its end
        self._poll_s = 0.0  # after the next flush, how long the event loop polls for the answer (a batch alone)
        self._answer_window = PollWindow(options.busy_poll_microseconds / 1e6)  # learns how soon lone batches answer
        self._exit_task: asyncio.Task[None] | None = None
        # The answers the worker owes, in the order it will send them (it answers in the order it was asked).
        self._replies: deque[asyncio.Future[Message]] = deque()
        self._drained: asyncio.Future[None] | None = None  # set once ``_replies`` is empty
        self._through_arena = False  # a batch that uses the arenas is on its way
        self._kill_reason = ""
        self._ready = False
        self.has_is_ready = False  # the model defines is_ready(), which each readiness check asks
        self._readiness: asyncio.Future[tuple[bool, str | None]] | None = None  # the check on its way
        self._stopping = False
        self.exit_description: str | None = None
        self._metrics = WorkerMetrics()
        self.open_requests = OpenRequests(label)
        handlers = {**self._metrics.handlers(), "is_cancelled": self.open_requests.is_cancelled}
        if client is not None:
            handlers.update(BlsCalls(client, self.open_requests).handlers())
        self._calls = WorkerCalls(label, handlers, self._send)

    @property
    def running(self) -> bool:
        """Started, initialized and not exited."""
        return self._ready and self.exit_description is None

    # ---- lifecycle ------------------------------------------------------------------------------

    async def start(self, init: dict[str, Any]) -> None:
        """Launch the worker and initialize the model; clean up and raise ServerError if either fails."""
        try:
            started = await self._launch()
            await self._wait_reply(started, self.options.stub_timeout_seconds, "start-up")
        except WorkerFailure as failure:
            await self._abort()
            raise WorkerStartFailed(f"python backend worker for {self.label} {failure} before it started",
                                    Status.INTERNAL) from None
        except BaseException:
            await self._abort()
            raise
        try:
            reply = await self._call(Kind.INIT, {**init, "input_arena": self._arenas["input"].name,
                                                 "output_arena": self._arenas["output"].name},
                                     self.options.stub_timeout_seconds, "initialize")
        except WorkerFailure as failure:
            await self._abort()
            raise ServerError(f"python backend worker for {self.label} {failure} while loading the model",
                              Status.INTERNAL) from None
        except BaseException:
            await self._abort()
            raise
        kind, body = reply
        if kind == Kind.FAILED:
            await self._abort()
            message, trace = body
            log.error("failed to initialize %s:\n%s", self.label, trace)
            raise ServerError(f"failed to initialize {self.label}: {message}", Status.INTERNAL)
        self.has_is_ready = bool(body)
        self._ready = True

    async def _launch(self) -> asyncio.Future[Message]:
        """Start the worker process and connect to it; the future its STARTED message resolves (it may come
        before the connection is made)."""
        prefix, size = self.options.shm_region_prefix_name, self.options.shm_default_byte_size
        self._arenas["input"] = Arena(prefix, size)
        self._arenas["output"] = Arena(prefix, size)
        server_end, worker_end = socket.socketpair()
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-u", "-m", "triton_serve_python.worker", str(worker_end.fileno()),
                pass_fds=(worker_end.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            server_end.close()
            raise
        finally:
            worker_end.close()
        self._exit_task = asyncio.create_task(self._watch_exit())
        loop = self._loop
        started: asyncio.Future[Message] = loop.create_future()
        self._replies.append(started)
        _OWING.add(self)
        try:
            self._transport, _ = await loop.create_unix_connection(lambda: _WorkerConnection(self),
                                                                   sock=server_end)
        except BaseException:
            server_end.close()
            raise
        return started

    async def stop(self) -> None:
        """Finalize the model and let the worker exit; kill it if that takes over stub-timeout-seconds."""
        self._stopping = True
        if self.exit_description is None and self._transport is not None:
            try:
                await self._call(Kind.FINALIZE, None, self.options.stub_timeout_seconds, "finalize")
            except WorkerFailure as failure:
                log.warning("python backend worker for %s %s while unloading", self.label, failure)
        await self._wait_exit()

    async def _abort(self) -> None:
        self._stopping = True
        self._kill("was killed because loading the model failed")
        await self._wait_exit()

    async def _wait_exit(self) -> None:
        if self._exit_task is None:
            self._release_arenas()
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._exit_task), self.options.stub_timeout_seconds)
        except asyncio.TimeoutError:
            self._kill(f"was killed because it did not exit within {self.options.stub_timeout_seconds:g} s")
            await self._exit_task

    def _kill(self, reason: str) -> None:
        if self._process is not None and self._process.returncode is None:
            self._kill_reason = self._kill_reason or reason
            try:
                self._process.kill()
            except ProcessLookupError:
                pass

    async def _watch_exit(self) -> None:
        assert self._process is not None
        returncode = await self._process.wait()
        self.exit_description = self._kill_reason or describe_exit(returncode)
        if self._transport is not None:
            self._transport.close()
        self._release_arenas()
        self._metrics.release_all()
        self._calls.close()
        how = "was stopped because the model unloads" if self._stopping else self.exit_description
        self.open_requests.fail_all(f"python backend worker for {self.label} {how} before the model sent the "
                                    "final response")
        while self._replies:
            self._fail(self._replies.popleft())
        _OWING.discard(self)
        self._wake_drained()
        if self._ready and not self._stopping:
            self._on_exit(self.exit_description)

    def _release_arenas(self) -> None:
        for arena in self._arenas.values():
            arena.release()
        self._arenas.clear()

    # ---- messages -------------------------------------------------------------------------------

    async def _call(self, kind: Kind, body: Any, timeout: float, what: str) -> Message:
        """Send a message and wait for the worker's answer (see ``_wait_reply``)."""
        if self.exit_description is not None or self._transport is None:
            raise WorkerFailure(self.exit_description or "is not running")
        reply: asyncio.Future[Message] = self._loop.create_future()
        self._replies.append(reply)
        _OWING.add(self)
        self._send(encode(kind, body))
        return await self._wait_reply(reply, timeout, what)

    async def _wait_reply(self, reply: asyncio.Future[Message], timeout: float, what: str) -> Message:
        """Wait for ``reply``, the worker's answer to a message; kill the worker if ``what`` takes over ``timeout``
        seconds (0: no limit), and raise WorkerFailure if it dies first."""
        if not timeout:
            return await reply
        timer = self._loop.call_later(timeout, self._time_out, reply, timeout, what)
        try:
            return await reply
        finally:
            timer.cancel()

    def _time_out(self, reply: asyncio.Future[Message], timeout: float, what: str) -> None:
        """``reply`` is overdue: kill the worker, and fail ``reply`` once it exited (if it did not come by then)."""
        if reply.done():
            return
        self._kill(f"was killed because {what} did not finish within {timeout:g} s")
        assert self._exit_task is not None
        self._exit_task.add_done_callback(lambda _task: self._fail(reply))

    def _fail(self, reply: asyncio.Future[Message]) -> None:
        if not reply.done():
            reply.set_exception(WorkerFailure(self.exit_description))

    async def _wait_drained(self) -> None:
        """Until the worker has answered everything it was asked (or died)."""
        while self._replies:
            if self._drained is None:
                self._drained = self._loop.create_future()
            await asyncio.shield(self._drained)

    def _wake_drained(self) -> None:
        if self._drained is not None and not self._replies:
            if not self._drained.done():
                self._drained.set_result(None)
            self._drained = None

    def _send(self, frame: bytes) -> None:
        """Queue ``frame`` for the worker: the frames of one event-loop turn (the requests of several connections
        that arrived together) leave in one write, which wakes the worker once. What the worker waits for while
        it owes one answer at most (a dynamic batcher's next batch, sent as the last one's responses are handed
        out; the answer to a call of a lone batch) leaves at once: the worker runs while this turn goes on."""
        self._outgoing.append(frame)
        if len(self._outgoing) == 1:
            if len(self._replies) == 1:
                self._flush()
            else:
                self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        frames, self._outgoing = self._outgoing, []
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frames[0] if len(frames) == 1 else b"".join(frames))
            if self._poll_s:
                self._loop.call_soon(self._poll, time.perf_counter() + self._poll_s)
        self._poll_s = 0.0

    def _poll(self, deadline: float) -> None:
        """Keep the event loop turning (its waits for I/O then take no time) until the answers are in or
        ``deadline`` passes: the answer is read as it arrives, without the wake-up of a sleeping process."""
        if self._replies and time.perf_counter() < deadline:
            self._loop.call_soon(self._poll, deadline)

    def _on_message(self, kind: Kind, body: Any) -> None:
        if kind == Kind.RESPONSE:
            self.open_requests.deliver(*body)
        elif kind == Kind.NOTIFY:
            self._calls.on_notify(*body)
        elif kind == Kind.CALL:
            self._calls.on_call(*body)
        elif kind == Kind.LOG:
            _log_model_line(*body)
        elif kind == Kind.GROW:
            self._grow_output(body)
        elif kind in _ANSWERS and self._replies:
            self._answer_window.came()
            reply = self._replies.popleft()
            if not reply.done():  # done: failed by a timeout while the answer was on its way
                if kind == Kind.RESULT:
                    self._read_result(body, reply)
                else:
                    reply.set_result((kind, body))
            if not self._replies:
                _OWING.discard(self)
                self._wake_drained()
        else:
            log.warning("unexpected %s message from the python backend worker for %s", kind.name, self.label)

    def _read_result(self, body: Any, reply: asyncio.Future[Message]) -> None:
        """Copy the outputs out of the frame or the arena now, before anything else (the next batch, the worker's
        exit) can replace them."""
        error, results, inline, timing = body
        if results is None:
            reply.set_result((Kind.RESULT, (error, None, None)))
            return
        try:
            if inline is not None:  # the frame's own bytes: nothing else writes them
                responses = read_responses(results, inline, copy=False)
            else:
                responses = read_responses(results, self._arenas["output"].buf, copy=True)
        except Exception as error:  # a worker bug must fail the batch, not the connection
            reply.set_exception(ServerError(f"unreadable outputs from the python backend worker for {self.label}: "
                                            f"{type(error).__name__}: {error}", Status.INTERNAL))
            return
        reply.set_result((Kind.RESULT, (None, responses, timing)))

    def _on_disconnect(self) -> None:
        if self.exit_description is None:
            self._loop.call_later(
                _EOF_GRACE_S, self._kill, "was killed because it closed its connection to the server")

    def _grow_output(self, needed: int) -> None:
        try:
            name = self._replace_arena("output", needed)
        except OSError as error:
            self._send(encode(Kind.GROWN, (None, str(error))))
            return
        self._send(encode(Kind.GROWN, (name, None)))

    def _replace_arena(self, direction: str, needed: int) -> str:
        old = self._arenas[direction]
        arena = Arena(self.options.shm_region_prefix_name,
                      grown_size(old.size, needed, self.options.shm_growth_byte_size))
        old.release()
        self._arenas[direction] = arena
        return arena.name

    # ---- readiness ------------------------------------------------------------------------------

    async def user_ready(self, timeout: float) -> tuple[bool, str | None]:
        """The model's ``is_ready()`` (True without one), or False and why: it raised, returned no bool, took
        over ``timeout`` seconds (the worker answers after the batches before it), or the worker is down.
        Checks that come while one is on its way share its answer, as in Triton."""
        if not self.has_is_ready:
            return True, None
        if self._readiness is None:
            self._readiness = asyncio.ensure_future(self._ask_ready())
            self._readiness.add_done_callback(self._readiness_done)
        try:
            return await asyncio.wait_for(asyncio.shield(self._readiness), timeout)
        except asyncio.TimeoutError:
            return False, "Timed out waiting for user-defined is_ready() response"

    async def _ask_ready(self) -> tuple[bool, str | None]:
        try:
            _kind, (ready, error) = await self._call(Kind.IS_READY, None, 0, "is_ready")
        except WorkerFailure as failure:
            return False, f"python backend worker for {self.label} {failure}"
        return bool(ready), error

    def _readiness_done(self, _future: asyncio.Future[tuple[bool, str | None]]) -> None:
        self._readiness = None

    # ---- requests -------------------------------------------------------------------------------

    async def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse | None]:
        """Run one batch: a response per request, or None where the model answers through the request's
        response sender. A batch-level error is raised as ServerError, a dead worker as WorkerFailure."""
        if not self.running:
            raise WorkerFailure(self.exit_description or "is not running")
        layout = TensorLayout(ALIGNMENT)
        described = describe_requests(requests, layout)
        if layout.size <= INLINE_LIMIT:
            if self._through_arena:
                await self._wait_drained()
            inline = bytearray(layout.size)
            layout.write(memoryview(inline))
            return await self._execute(requests, (None, described, None, inline))
        await self._wait_drained()  # the arenas serve one batch, with nothing else on its way
        if not self.running:
            raise WorkerFailure(self.exit_description or "is not running")
        new_input = None
        if layout.size > self._arenas["input"].size:
            try:
                new_input = self._replace_arena("input", layout.size)
            except OSError as error:
                raise ServerError(f"no shared memory for {layout.size} bytes of inputs of {self.label}: {error}",
                                  Status.UNAVAILABLE) from None
        layout.write(self._arenas["input"].buf)
        self._through_arena = True
        try:
            return await self._execute(requests, (new_input, described, None, None))
        finally:
            self._through_arena = False

    async def _execute(self, requests: Sequence[InferenceRequest], body: tuple[Any, ...]) -> list[InferenceResponse | None]:
        keys = self.open_requests.add(requests)
        poll_s = 0.0  # a batch alone: the most the worker may poll for the next one, and the server for the answer
        if not _OWING:
            poll_s = self._answer_window.limit_s
            self._poll_s = max(self._poll_s, self._answer_window.seconds)
            self._answer_window.wait_began(time.perf_counter())
        body = (body[0], body[1], keys, body[3], poll_s)
        try:
            _kind, (batch_error, responses, timing) = await self._call(
                Kind.EXECUTE, body, self.options.execute_timeout_seconds, "execute")
        except BaseException:
            self.open_requests.executed(keys, [True] * len(keys))  # the caller fails the whole batch
            raise
        answered = [True] * len(keys) if responses is None else [response is not None for response in responses]
        self.open_requests.executed(keys, answered)
        if batch_error is not None:
            message, code_name, trace = batch_error
            if trace:
                log.error("%s\n%s", message, trace)
            raise ServerError(message, Status[code_name])
        if timing is not None:  # the worker's own clock: the time this batch waited behind others is not inference
            mark_inputs_ready(timing[0])
            mark_outputs_ready(timing[1])
        return responses
