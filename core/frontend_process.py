"""A front-end process, ``python -m triton_serve.frontend_process <fd> <options JSON>``: it accepts HTTP
and gRPC on the server's ports (SO_REUSEPORT) and forwards every call to the model owner over a
channel (``channel.py``), through ``RemoteDataPlane``, which offers the front-ends the data
plane's methods."""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import socket
import sys
from typing import Any

from . import channel
from .dataplane import serve_one
from .errors import ServerError, unavailable
from .frontends import FrontendOptions, Frontends, run_on_fast_loop
from .inference import InferenceRequest, InferenceResponse
from .protos.model_config_pb2 import ModelConfig

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


class RemoteDataPlane:
    """The data plane's front-end API, answered by the model owner over the channel."""

    def __init__(self) -> None:
        self.accepting = True
        self.lost = asyncio.Event()  # the owner went away
        self._writer: channel.FrameWriter | None = None
        self._ids = itertools.count(1)
        self._requests: dict[int, InferenceRequest] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}

    async def connect(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_unix_connection(lambda: _OwnerConnection(self), sock=sock)
        self._writer = channel.FrameWriter(transport)

    def send_frame(self, frame: bytes) -> None:
        if self._writer is None or self._writer.closed:
            raise unavailable("the model owner process is gone; the server is shutting down")
        self._writer.write(frame)

    # ---- calls ----------------------------------------------------------------------------------

    async def _call(self, method: str, *args: Any) -> Any:
        call_id = next(self._ids)
        future = self._calls[call_id] = asyncio.get_running_loop().create_future()
        try:
            self.send_frame(channel.encode(channel.CALL, call_id, (method, args)))
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def live(self) -> bool:
        return bool(await self._call("live"))

    async def server_ready(self) -> bool:
        return self.accepting and bool(await self._call("server_ready"))

    async def server_metadata(self) -> dict[str, Any]:
        return await self._call("server_metadata")

    async def model_ready(self, name: str, version: int | None = None) -> bool:
        return bool(await self._call("model_ready", name, version))

    async def model_metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        return await self._call("model_metadata", name, version)

    async def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        return ModelConfig.FromString(await self._call("model_config", name, version))

    async def model_config_json(self, name: str, version: int | None = None) -> dict[str, Any]:
        return await self._call("model_config_json", name, version)

    async def is_decoupled(self, name: str, version: int | None = None) -> bool:
        return bool(await self._call("is_decoupled", name, version))

    async def model_statistics(self, name: str = "", version: int | None = None) -> list[dict[str, Any]]:
        return await self._call("model_statistics", name, version)

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return await self._call("repository_index", ready_only)

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        await self._call("load_model", name, parameters)

    async def unload_model(self, name: str) -> None:
        await self._call("unload_model", name)

    async def register_system_shared_memory(self, name: str, key: str, offset: int, byte_size: int) -> None:
        await self._call("register_system_shared_memory", name, key, offset, byte_size)

    async def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int,
                                          byte_size: int) -> None:
        await self._call("register_cuda_shared_memory", name, raw_handle, device_id, byte_size)

    async def shared_memory_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        return await self._call("shared_memory_status", kind, name)

    async def unregister_shared_memory(self, kind: str, name: str = "") -> None:
        await self._call("unregister_shared_memory", kind, name)

    # ---- inference ------------------------------------------------------------------------------

    def submit(self, request: InferenceRequest, *, decoupled_error: str | None = None) -> None:
        """Send the request to the owner; its responses arrive through ``request.send``."""
        request_id = next(self._ids)
        self.send_frame(channel.encode_request(request_id, request, decoupled_error))
        self._requests[request_id] = request
        request.on_cancel = lambda: self._cancel(request_id)

    async def infer(self, request: InferenceRequest, decoupled_error: str) -> InferenceResponse:
        return await serve_one(self, request, decoupled_error)

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
                    future.set_exception(channel.decode_error(value))

    def _on_disconnect(self) -> None:
        gone = unavailable("the model owner process is gone; the server is shutting down")
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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname).1s %(name)s] %(message)s")
    options = FrontendOptions.from_dict(json.loads(argv[2]))
    return run_on_fast_loop(run(int(argv[1]), options))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
