"""The model owner's side of multi-process serving: starts the front-end processes, serves each one's
channel with the data plane, and restarts a front-end process that dies."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import itertools
import subprocess
import sys
from collections.abc import Awaitable
from typing import Any

from . import channel, wire
from .dataplane import DataPlane
from .seam import call_by_name
from .errors import ServerError, internal, unavailable, unexpected
from .frontend.frontends import FrontendOptions
from .frontend.http.serving import listen_socket
from .inference import InferenceRequest, InferenceResponse
from .log_settings import LogSettings
from .tracing import Trace

log = logging.getLogger("triton_serve.frontend")

START_TIMEOUT_S = 60.0
RESTART_DELAY_S = 0.5
SETTINGS_WAIT_S = 5.0  # how long a change of the log or trace settings waits for the processes to have it


def default_process_count() -> int:
    """One front-end process per core this server may use, on 4 cores or more; none (both protocols
    served by the model owner) below that, where the extra hop costs more than the parallelism gives
    (bench/README.md has the figures)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores if cores >= 4 else 0


class _Endpoint(asyncio.Protocol):
    """The owner's end of one front-end process's channel: runs its requests and calls."""

    def __init__(self, dataplane: DataPlane, started: asyncio.Future[str | None]) -> None:
        self.dataplane = dataplane
        self.started = started
        self.requests: dict[int, InferenceRequest] = {}
        self.served = 0  # requests received over this channel
        self.traces: dict[int, Trace] = {}  # answered traced requests, until their front-end timestamps come
        self._reader = channel.FrameReader()
        self._writer: channel.FrameWriter | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self.applied: dict[int, asyncio.Future[None]] = {}  # settings frames sent, until the process has them
        self._settings_ids = itertools.count(1)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._writer = channel.FrameWriter(transport)  # type: ignore[arg-type]
        if self.dataplane.trace_armed:
            self.send_settings(channel.TRACE_ARMED, (True,))

    def data_received(self, data: bytes) -> None:
        for kind, frame_id, meta, payload in self._reader.feed(data):
            if kind == channel.REQUEST:
                self._start_request(frame_id, meta, payload)
            elif kind == channel.CANCEL:
                request = self.requests.get(frame_id)
                if request is not None:
                    request.cancel()
            elif kind == channel.CALL:
                task = asyncio.get_running_loop().create_task(self._answer_call(frame_id, *meta))
                self._calls.add(task)
                task.add_done_callback(self._calls.discard)
            elif kind == channel.TRACE_STAMPS:
                trace = self.traces.pop(frame_id, None)
                if trace is not None:
                    trace.frontend_done(meta)
            elif kind == channel.SETTINGS_APPLIED:
                applied = self.applied.pop(frame_id, None)
                if applied is not None and not applied.done():
                    applied.set_result(None)
            elif kind == channel.STARTED and not self.started.done():
                self.started.set_result(meta[0])

    @property
    def ended(self) -> bool:
        """Whether its connection has closed."""
        return self._writer is not None and self._writer.closed

    def connection_lost(self, exc: Exception | None) -> None:
        """The front-end process is gone: its queued requests are dropped, its clients with it."""
        for request in list(self.requests.values()):
            request.cancel()
        for task in self._calls:
            task.cancel()
        for trace in self.traces.values():
            trace.frontend_done([])
        self.traces.clear()
        for applied in self.applied.values():  # a restarted process starts with the settings in force
            if not applied.done():
                applied.set_result(None)
        self.applied.clear()
        if not self.started.done():
            self.started.set_result("the front-end process exited before it started serving")

    def _write(self, frame: bytes) -> None:
        if self._writer is not None and not self._writer.closed:
            self._writer.write(frame)

    def send_settings(self, kind: int, meta: Any) -> asyncio.Future[None]:
        """Send a settings frame (LOG_SETTINGS or TRACE_ARMED); the future is done once the process has it in force
        (or is gone)."""
        applied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.ended:
            applied.set_result(None)
            return applied
        frame_id = next(self._settings_ids)
        self.applied[frame_id] = applied
        applied.add_done_callback(lambda _: self.applied.pop(frame_id, None))  # answered, or given up on
        self._write(channel.encode(kind, frame_id, meta))
        return applied

    def _ask_trace_stamps(self, request_id: int, trace: Any) -> None:
        """A traced request is answered: have its front-end send its timestamps (asked before the answer
        goes, so that the front-end knows when it sends it)."""
        if not isinstance(trace, Trace) or not trace.awaits_frontend:
            return
        if self._writer is None or self._writer.closed:
            trace.frontend_done([])
            return
        self.traces[request_id] = trace
        self._writer.write(channel.encode(channel.TRACED, request_id, None))

    def _start_request(self, request_id: int, meta: Any, payload: memoryview) -> None:
        try:
            request, decoupled_error = channel.decode_request(meta, payload)
        except (ValueError, TypeError) as error:
            self._write(channel.encode_response(request_id, InferenceResponse.from_error(
                internal(f"unreadable request from a front-end process: {error}")), True, None))
            return

        def sink(response: InferenceResponse | None, final: bool) -> None:
            if final:
                self.requests.pop(request_id, None)
                if request.trace is not None:
                    self._ask_trace_stamps(request_id, request.trace)
            self._write(channel.encode_response(request_id, response, final, request.model_version))

        request.set_sink(sink)
        self.requests[request_id] = request
        self.served += 1
        try:
            self.dataplane.submit(request, decoupled_error=decoupled_error)
        except ServerError as error:
            self.requests.pop(request_id, None)
            self._ask_trace_stamps(request_id, request.trace)
            self._write(channel.encode_response(request_id, InferenceResponse.from_error(error), True,
                                                request.model_version))

    async def _answer_call(self, call_id: int, method: str, args: Any) -> None:
        try:
            result = await call_by_name(self.dataplane, method, args)
            if method == "model_config":
                result = result.SerializeToString()
            reply = channel.encode(channel.REPLY, call_id, (True, result))
        except ServerError as error:
            reply = channel.encode(channel.REPLY, call_id, (False, wire.encode_error(error)))
        except Exception as error:
            log.exception("front-end call %s failed", method)
            reply = channel.encode(channel.REPLY, call_id, (False, wire.encode_error(unexpected(error))))
        self._write(reply)


class ChannelListener:
    """``serve_channel``'s TCP listener: its port, the requests its connections hold now, ``close()``."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.server: asyncio.Server | None = None
        self._endpoints: list[_Endpoint] = []

    def endpoint(self) -> _Endpoint:
        """A new connection's end (no STARTED frame comes over TCP: its future is never awaited)."""
        self._endpoints = [endpoint for endpoint in self._endpoints if not endpoint.ended]
        endpoint = _Endpoint(self.dataplane, asyncio.get_running_loop().create_future())
        self._endpoints.append(endpoint)
        return endpoint

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def ongoing(self) -> int:
        """The requests received and not yet answered, over every connection."""
        return sum(len(endpoint.requests) for endpoint in self._endpoints if not endpoint.ended)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def serve_channel(dataplane: DataPlane, host: str, port: int) -> ChannelListener:
    """Serve ``dataplane`` over the channel on a TCP port (0: any free one): each connection is a front-end
    elsewhere (a ``RemoteDataPlane`` connected with ``connect_tcp``), answered as a front-end process is."""
    listener = ChannelListener(dataplane)
    listener.server = await asyncio.get_running_loop().create_server(listener.endpoint, host, port)
    return listener


class _FrontendProcess:
    """One front-end process, relaunched by its pool when it dies."""

    def __init__(self, pool: FrontendPool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.process: asyncio.subprocess.Process | None = None
        self.endpoint: _Endpoint | None = None
        self.watcher: asyncio.Task[None] | None = None

    async def launch(self) -> str | None:
        """Start the process and wait until it serves; the error text if it could not."""
        loop = asyncio.get_running_loop()
        owner_end, frontend_end = socket.socketpair()
        started: asyncio.Future[str | None] = loop.create_future()
        log_control = self.pool.dataplane.log_control
        log_settings = log_control.settings
        try:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "triton_serve._engine.frontend.process", str(frontend_end.fileno()),
                json.dumps(self.pool.options.to_dict()), json.dumps(log_settings.as_dict()),
                json.dumps(wire.content_type_names()), pass_fds=(frontend_end.fileno(),), stdin=subprocess.DEVNULL)
            endpoint = self.endpoint = _Endpoint(self.pool.dataplane, started)
            await loop.create_unix_connection(lambda: endpoint, sock=owner_end)
        except BaseException:
            owner_end.close()
            raise
        finally:
            frontend_end.close()
        if log_control.settings != log_settings:  # changed while the process started
            endpoint.send_settings(channel.LOG_SETTINGS, log_control.settings.as_dict())
        self.watcher = loop.create_task(self._watch(self.process))
        try:
            return await asyncio.wait_for(started, START_TIMEOUT_S)
        except asyncio.TimeoutError:
            return f"the front-end process did not start serving within {START_TIMEOUT_S:g} s"

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if self.pool.stopping:
            return
        log.error("front-end process %d (pid %d) exited with code %s; restarting it", self.index, process.pid, code)
        await asyncio.sleep(RESTART_DELAY_S)
        while not self.pool.stopping:
            error = await self.launch()
            if error is None:
                log.info("front-end process %d restarted (pid %d)", self.index, self.process.pid)  # type: ignore[union-attr]
                return
            log.error("front-end process %d could not be restarted: %s", self.index, error)
            await asyncio.sleep(RESTART_DELAY_S * 10)

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.returncode is None:
            try:
                self.process.send_signal(signum)
            except ProcessLookupError:
                pass

    async def wait_exit(self, timeout: float) -> None:
        if self.process is None:
            return
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("front-end process %d did not stop within %g s; killing it", self.index, timeout)
            self.signal(signal.SIGKILL)
            await self.process.wait()


async def _all_applied(applied: list[asyncio.Future[None]]) -> None:
    """Wait until every process has a settings frame in force, at most SETTINGS_WAIT_S: one that does not say so by
    then is stuck or restarting, and a restarted one starts with the settings in force."""
    try:
        await asyncio.wait(applied, timeout=SETTINGS_WAIT_S)
    finally:
        for waiting in applied:  # not waited for any longer (late, or the update was cancelled): nothing keeps it
            waiting.cancel()


class FrontendPool:
    """``count`` front-end processes accepting on the server's ports, forwarding to ``dataplane``.

    ``await start()`` returns once every process serves (or raises, naming what failed);
    ``request_stop()`` asks each to drain; ``await wait_stopped()``.
    """

    def __init__(self, dataplane: DataPlane, options: FrontendOptions, count: int) -> None:
        self.dataplane = dataplane
        self.options = options
        self.processes = [_FrontendProcess(self, index) for index in range(count)]
        self.stopping = False
        dataplane.log_control.subscribe(self._send_log_settings)
        dataplane.tracer.subscribe(self._send_trace_armed)

    def _send_log_settings(self, settings: LogSettings) -> Awaitable[None] | None:
        return self._send_settings(channel.LOG_SETTINGS, settings.as_dict())

    def _send_trace_armed(self, armed: bool) -> Awaitable[None] | None:
        return self._send_settings(channel.TRACE_ARMED, (armed,))

    def _send_settings(self, kind: int, meta: Any) -> Awaitable[None] | None:
        """Send a settings frame to every process now; what it returns waits until each has it in force."""
        applied = [process.endpoint.send_settings(kind, meta) for process in self.processes
                   if process.endpoint is not None]
        return _all_applied(applied) if applied else None

    async def start(self) -> None:
        self._check_ports_free()
        errors = await asyncio.gather(*(process.launch() for process in self.processes))
        failed = [error for error in errors if error is not None]
        if failed and not self.stopping:  # a stop asked for during start-up is no failure
            self.request_stop()
            await self.wait_stopped()
            raise unavailable(failed[0])

    def _check_ports_free(self) -> None:
        """A port another program holds is an error, as in Triton (the processes share it with SO_REUSEPORT)."""
        options = self.options
        if options.allow_http and not options.reuse_http_port:
            listen_socket(options.http_address, options.http_port).close()
        if options.allow_grpc and not options.reuse_grpc_port:
            listen_socket(options.grpc_address, options.grpc_port, what="gRPC").close()

    def request_stop(self) -> None:
        self.stopping = True
        for process in self.processes:
            process.signal(signal.SIGTERM)

    async def wait_stopped(self) -> None:
        grace = self.options.exit_timeout_secs + 5
        await asyncio.gather(*(process.wait_exit(grace) for process in self.processes))
        for process in self.processes:
            if process.watcher is not None:
                process.watcher.cancel()

    def pids(self) -> list[int]:
        """The live front-end processes' ids."""
        return [p.process.pid for p in self.processes if p.process is not None and p.process.returncode is None]
