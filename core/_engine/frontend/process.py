"""A front-end process, ``python -m triton_serve._engine.frontend.process <fd> <options JSON> <log settings JSON>
<content types JSON>``: it accepts HTTP and gRPC on the server's ports (SO_REUSEPORT) and forwards every call to the model owner
over a channel (``channel.py``), through ``RemoteDataPlane``, which offers the front-ends the data plane's
methods; it logs as the owner's log settings say (``channel.LOG_SETTINGS`` brings each change)."""
from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import signal
import socket
import sys
from typing import Any

from .. import channel, wire
from ..errors import ServerError, unavailable
from .frontends import FrontendOptions, Frontends, run_on_fast_loop
from ..inference import InferenceRequest
from ..log_settings import LogSettings, apply_log_settings
from ..protos.model_config_pb2 import ModelConfig
from ..seam import ForwardingDataPlane
from .trace import Stamps

log = logging.getLogger("triton_serve.frontend")


class _OwnerConnection(asyncio.Protocol):
    def __init__(self, remote: RemoteDataPlane) -> None:
        self._remote = remote
        self._reader = channel.FrameReader()

    def data_received(self, data: bytes) -> None:
        for frame in self._reader.feed(data):
            self._remote._on_frame(*frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._remote._on_disconnect()


class RemoteDataPlane(ForwardingDataPlane):
    """The data-plane seam in a front-end process: each call of ``seam.REMOTE_CALLS`` is forwarded by name to
    the model owner (a ``channel.CALL`` frame) and answered there by its DataPlane; ``submit`` sends the
    request and delivers the responses that come back to it. ``lost_message`` is what its requests and calls fail
    with (UNAVAILABLE) once the channel closes."""

    def __init__(self, lost_message: str = "the model owner process is gone; the server is shutting down") -> None:
        self.lost_message = lost_message
        self.accepting = True
        self.trace_armed = False  # the owner says whether to note trace timestamps (channel.TRACE_ARMED)
        self.lost = asyncio.Event()  # the owner went away
        self._writer: channel.FrameWriter | None = None
        self._ids = itertools.count(1)
        self._requests: dict[int, InferenceRequest] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}

    async def connect(self, sock: socket.socket) -> None:
        """Connect over ``sock``, the front-end process's end of its Unix socket pair with the owner."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_unix_connection(lambda: _OwnerConnection(self), sock=sock)
        self._writer = channel.FrameWriter(transport)

    async def connect_tcp(self, host: str, port: int) -> None:
        """Connect to a data plane that ``serve_channel`` serves on another host (or process)."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(lambda: _OwnerConnection(self), host, port)
        self._writer = channel.FrameWriter(transport)

    def close(self) -> None:
        """Close the channel: the requests and calls still waiting on it fail UNAVAILABLE."""
        if self._writer is not None:
            self._writer.transport.close()

    def send_frame(self, frame: bytes) -> None:
        """Send one channel frame to the owner; ServerError (UNAVAILABLE) once the channel is closed."""
        if self._writer is None or self._writer.closed:
            raise unavailable(self.lost_message)
        self._writer.write(frame)

    # ---- calls ----------------------------------------------------------------------------------

    async def forward(self, method: str, arguments: dict[str, Any]) -> Any:
        """Send the call to the owner and wait for its REPLY frame."""
        call_id = next(self._ids)
        future = self._calls[call_id] = asyncio.get_running_loop().create_future()
        try:
            self.send_frame(channel.encode(channel.CALL, call_id, (method, tuple(arguments.values()))))
            result = await future
        finally:
            self._calls.pop(call_id, None)
        return ModelConfig.FromString(result) if method == "model_config" else result  # protobuf crosses as bytes

    async def server_ready(self) -> bool:
        """The owner's readiness, false once this front-end stops accepting."""
        return self.accepting and bool(await self.forward("server_ready", {}))

    # ---- inference ------------------------------------------------------------------------------

    def submit(self, request: InferenceRequest, *, decoupled_error: str | None = None) -> None:
        """Send the request to the owner; its responses arrive through ``request.send``."""
        request_id = next(self._ids)
        self.send_frame(channel.encode_request(request_id, request, decoupled_error))
        self._requests[request_id] = request
        request.on_cancel = lambda: self._cancel(request_id)

    def _cancel(self, request_id: int) -> None:
        if request_id in self._requests and self._writer is not None and not self._writer.closed:
            self._writer.write(channel.encode(channel.CANCEL, request_id, None))

    # ---- frames from the owner --------------------------------------------------------------------

    def _on_frame(self, kind: int, frame_id: int, meta: Any, data: memoryview) -> None:
        if kind == channel.RESPONSE:
            request = self._requests.get(frame_id)
            if request is None:
                return
            response, final, request.model_version = channel.decode_response(meta, data)
            if final:
                del self._requests[frame_id]
            request.send(response, final=final)
        elif kind == channel.REPLY:
            future = self._calls.get(frame_id)
            if future is not None and not future.done():
                ok, value = meta
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(wire.decode_error(value))
        elif kind == channel.LOG_SETTINGS:
            apply_log_settings(LogSettings(**meta))
            self._say_applied(frame_id)
        elif kind == channel.TRACED:
            request = self._requests.get(frame_id)
            if request is not None and request.trace is not None:
                request.trace.report_to(functools.partial(self._send_trace_stamps, frame_id))
        elif kind == channel.TRACE_ARMED:
            self.trace_armed = meta[0]
            self._say_applied(frame_id)

    def _say_applied(self, frame_id: int) -> None:
        """Tell the owner that the settings frame ``frame_id`` is in force (0: it did not ask)."""
        if frame_id and self._writer is not None and not self._writer.closed:
            self._writer.write(channel.encode(channel.SETTINGS_APPLIED, frame_id, None))

    def _send_trace_stamps(self, request_id: int, stamps: Stamps) -> None:
        if self._writer is not None and not self._writer.closed:
            self._writer.write(channel.encode(channel.TRACE_STAMPS, request_id, stamps))

    def _on_disconnect(self) -> None:
        gone = unavailable(self.lost_message)
        for request in self._requests.values():
            request.fail(gone)
        self._requests.clear()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(gone)
        self.lost.set()


async def run(fd: int, options: FrontendOptions) -> int:
    remote = RemoteDataPlane()
    await remote.connect(socket.socket(fileno=fd))
    frontends = Frontends(remote, options, reuse_port=True)
    try:
        await frontends.start()
    except ServerError as error:
        remote.send_frame(channel.encode(channel.STARTED, 0, (error.message,)))
        return 1
    remote.send_frame(channel.encode(channel.STARTED, 0, (None,)))

    def stop() -> None:
        remote.accepting = False
        frontends.request_stop()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop)
    loop.add_signal_handler(signal.SIGINT, lambda: None)  # Ctrl-C reaches the owner, which stops us
    owner_gone = asyncio.create_task(remote.lost.wait())
    owner_gone.add_done_callback(lambda _: stop())
    await frontends.wait_stopped()
    owner_gone.cancel()
    return 0


def main(argv: list[str]) -> int:
    """``python -m triton_serve._engine.frontend.process FD OPTIONS LOG_SETTINGS CONTENT_TYPES`` (the last three as
    JSON; the content types the owner's requests and responses cross in: ``wire.content_type_names``)."""
    apply_log_settings(LogSettings(**json.loads(argv[3])))
    wire.use_content_types(json.loads(argv[4]))
    options = FrontendOptions.from_dict(json.loads(argv[2]))
    return run_on_fast_loop(run(int(argv[1]), options))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
