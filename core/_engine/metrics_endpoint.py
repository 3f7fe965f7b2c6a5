"""The metrics port: ``GET /metrics`` served by the model owner on its own event loop, whatever
``--frontend-processes`` says (front-end processes hold no statistics)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from .custom_metrics import custom_metrics
from .frontend.http.serving import listen_socket, serve_http
from .metrics import MetricsConfig, TritonCollector, render
from .repository import ModelRepository
from .seam import PROMETHEUS_TEXT
from .system_metrics import SystemSampler

log = logging.getLogger("triton_serve._engine.metrics")


class MetricsEndpoint:
    """``await start()`` binds ``address:port`` and serves; ``await stop()`` closes it."""

    def __init__(self, repository: ModelRepository, config: MetricsConfig, *, address: str, port: int,
                 cache_enabled: bool, cpu: bool, gpu: bool, interval_ms: float, http_server: str = "uvicorn") -> None:
        self.address, self.port, self.http_server = address, port, http_server
        self.system = SystemSampler(cpu, gpu, interval_ms / 1000)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(TritonCollector(repository, config, cache_enabled, self.system))
        self.registry.register(custom_metrics)  # what plugins create (Python models' MetricFamily)
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        sock = listen_socket(self.address, self.port, what="metrics")
        self.system.start()
        self._task = asyncio.get_running_loop().create_task(
            serve_http(_MetricsApp(self.exposition), sock, self.http_server, self._stopping, graceful_timeout=1.0))
        log.info("serving metrics on %s:%d", self.address, self.port)

    async def stop(self) -> None:
        self._stopping.set()
        await self.system.stop()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
            self._task = None

    def exposition(self) -> bytes:
        """The text every scrape returns (built from the statistics now)."""
        return render(self.registry)



class _MetricsApp:
    """A minimal ASGI app: GET (or HEAD) /metrics; anything else is 404, as on Triton's metrics port."""

    def __init__(self, exposition: Callable[[], bytes]) -> None:
        self.exposition = exposition

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            status, content_type, body = 200, PROMETHEUS_TEXT, self.exposition()
        else:
            status, content_type, body = 404, "text/plain; charset=utf-8", b"Not Found"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type.encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
