"""Runs the HTTP app: uvicorn with httptools by default, hypercorn when chosen, on a socket we bind."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

from ..errors import unavailable

HTTP_SERVERS = ("uvicorn", "hypercorn")
GRACEFUL_TIMEOUT_S = 30.0
KEEP_ALIVE_S = 75.0


def listen_socket(host: str, port: int, *, reuse_port: bool = False, what: str = "HTTP") -> socket.socket:
    """A listening TCP socket; ``reuse_port`` lets several front-end processes accept on one port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise unavailable(f"failed to start the {what} front-end: cannot bind {host}:{port} "
                          f"({error.strerror or error})") from None
    sock.setblocking(False)
    return sock


async def serve_http(app: Any, sock: socket.socket, server: str, stopping: asyncio.Event,
                     graceful_timeout: float = GRACEFUL_TIMEOUT_S) -> None:
    """Serve ``app`` on ``sock`` until ``stopping`` is set, then drain in-flight requests (for at most
    ``graceful_timeout`` seconds) and return."""
    if server == "hypercorn":
        await _serve_hypercorn(app, sock, stopping, graceful_timeout)
    else:
        await _serve_uvicorn(app, sock, stopping, graceful_timeout)


async def _serve_uvicorn(app: Any, sock: socket.socket, stopping: asyncio.Event, graceful_timeout: float) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # the server's own signal handlers stay in charge
            yield

    config = uvicorn.Config(app, http=_one_write_per_response(), ws="none", lifespan="off", loop="none", access_log=False,
                            log_config=None, timeout_keep_alive=int(KEEP_ALIVE_S),
                            timeout_graceful_shutdown=max(int(graceful_timeout), 1), server_header=False)
    server = Server(config)

    async def stop_when_asked() -> None:
        await stopping.wait()
        server.should_exit = True

    watcher = asyncio.create_task(stop_when_asked())
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()


def _one_write_per_response() -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol on a transport that sends the response head and body, which
    uvicorn writes separately, in one system call."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class OneWritePerResponse(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(_CoalescingTransport(transport))  # type: ignore[arg-type]

    return OneWritePerResponse


class _CoalescingTransport:
    """Wraps a transport: what is written during one event-loop turn leaves in one write at its end."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def _serve_hypercorn(app: Any, sock: socket.socket, stopping: asyncio.Event, graceful_timeout: float) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # our log handlers only: no second copy
    config.graceful_timeout = graceful_timeout
    config.keep_alive_timeout = KEEP_ALIVE_S
    try:
        await serve(app, config, shutdown_trigger=stopping.wait)
    finally:
        sock.close()
