"""Runs the HTTP app: uvicorn with httptools by default, hypercorn when chosen, on a socket we bind."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

from ...errors import unavailable
from .infer_protocol import http_protocol

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
                     graceful_timeout: float = GRACEFUL_TIMEOUT_S, *, protocol: type[asyncio.Protocol] | None = None) -> None:
    """Serve ``app`` on ``sock`` until ``stopping`` is set, then drain in-flight requests (for at most
    ``graceful_timeout`` seconds) and return. Under uvicorn, ``protocol`` (default: ``http_protocol(None)``)
    parses the connections."""
    if server == "hypercorn":
        await _serve_hypercorn(app, sock, stopping, graceful_timeout)
    else:
        await _serve_uvicorn(app, sock, stopping, graceful_timeout, protocol or http_protocol(None))


async def _serve_uvicorn(app: Any, sock: socket.socket, stopping: asyncio.Event, graceful_timeout: float,
                         protocol: type[asyncio.Protocol]) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # the server's own signal handlers stay in charge
            yield

    # uvicorn's own lifecycle lines ("Started server process", "Shutting down", ...) repeat for every socket it
    # serves; the server logs what it serves once, so only uvicorn's warnings and errors pass.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    config = uvicorn.Config(app, http=protocol, ws="none", lifespan="off", loop="none", access_log=False,
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
