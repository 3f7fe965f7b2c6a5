"""The ``redis`` response cache: entries live in a Redis server that any number of triton-serve servers share."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.connection import BlockingConnectionPool, Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from triton_serve.plugin import CustomMetric, InferenceResponse, ResponseCache, ServerError, Status, custom_metrics

from .codec import UnreadableEntry, decode, encode
from .options import RedisSettings, parse_settings

log = logging.getLogger(__name__)
KEY_PREFIX = "tserve:"  # every entry's Redis key is this and the request's digest
ERRORS_METRIC = "tserve_redis_cache_errors_total"
# After a failed call, lookups and inserts skip Redis this long before one tries it again.
RETRY_AFTER_S = 1.0


def _ca_bundle(directory: str) -> str:
    """The PEM certificates in ``directory`` (Triton's cacert_dir), as one bundle (redis-py's asyncio TLS takes no
    directory)."""
    files = sorted(p for p in Path(directory).iterdir() if p.suffix in (".pem", ".crt") and p.is_file())
    if not files:
        raise ServerError(f"--cache-config redis: 'cacert_dir' '{directory}' holds no .pem or .crt file",
                          Status.INVALID_ARG)
    return "\n".join(p.read_text() for p in files)


class RedisResponseCache(ResponseCache):
    """Lookups and inserts go to Redis on the server's event loop, each bounded in time. When Redis fails, the
    failure is counted on ``/metrics`` (``tserve_redis_cache_errors_total``), one warning is logged, and requests
    are served uncached, Redis untried for ``RETRY_AFTER_S`` at a time, until it answers again."""

    remote = True

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)
        self.settings = settings = parse_settings(options)
        connection = settings.connection_kwargs()
        tls = connection.pop("ssl", False)
        ca_path = connection.pop("ssl_ca_path", None)
        if ca_path is not None:
            connection["ssl_ca_data"] = _ca_bundle(ca_path)
        self._check_reachable(connection, tls)
        pool = BlockingConnectionPool(max_connections=settings.pool_size,
                                      timeout=settings.seconds(settings.wait_timeout),  # type: ignore[arg-type]
                                      connection_class=SSLConnection if tls else Connection,
                                      retry=Retry(NoBackoff(), 1), **connection)  # one reconnect: a stale socket
        self.client = redis.asyncio.Redis(connection_pool=pool)
        # The longest a call may take: a pooled connection, connecting, one reply.
        self.call_timeout = sum(settings.seconds(ms) for ms in (settings.wait_timeout, settings.connect_timeout,
                                                                 settings.socket_timeout))
        errors = custom_metrics.family(ERRORS_METRIC, "Failed calls of the redis response cache to Redis (the "
                                       "requests were served uncached)", "counter")
        self.lookup_errors = errors.metric({"operation": "lookup"})
        self.insert_errors = errors.metric({"operation": "insert"})
        self._retry_at = 0.0  # monotonic time before which Redis is not asked (it failed)
        self._failing = False  # a failure was logged and Redis has not answered since
        self._inserts: set[asyncio.Task[None]] = set()

    def _check_reachable(self, connection: dict[str, Any], tls: bool) -> None:
        """Ping the server once, as Triton's cache does when it starts; the start fails if it does not answer."""
        client = redis.Redis(ssl=tls, **connection)
        try:
            client.ping()
        except redis.RedisError as error:
            raise ServerError(f"Failed to initialize RedisCache: {error}", Status.INTERNAL) from None
        finally:
            client.close()

    def lookup(self, key: str) -> InferenceResponse | None:
        """Not called: the data plane awaits ``fetch`` of a remote cache."""
        return None

    async def fetch(self, key: str) -> InferenceResponse | None:
        """The response stored under ``key`` by any server sharing this Redis; None on a miss, on an entry this
        format cannot read, and (counted, logged once) when Redis fails or is not asked because it failed."""
        value = await self._call(lambda: self.client.get(KEY_PREFIX + key), self.lookup_errors)
        if not isinstance(value, bytes):
            return None
        try:
            return decode(value)
        except UnreadableEntry as error:
            log.debug("redis cache entry %s ignored: %s", key, error)
            return None

    def insert(self, key: str, response: InferenceResponse) -> None:
        """Store ``response`` under ``key`` in a task of its own: the response goes out without waiting for Redis."""
        if time.monotonic() < self._retry_at:
            return
        try:
            value = encode(response)
        except (TypeError, ValueError) as error:  # a parameter JSON cannot hold, say
            log.debug("response for cache key %s not cached: %s", key, error)
            return
        task = asyncio.get_running_loop().create_task(self._store(key, value))
        self._inserts.add(task)
        task.add_done_callback(self._inserts.discard)

    async def _store(self, key: str, value: bytes) -> None:
        await self._call(lambda: self.client.set(KEY_PREFIX + key, value), self.insert_errors)

    async def _call(self, command: Callable[[], Awaitable[Any]], errors: CustomMetric) -> Any:
        """``command``'s result; None (and the failure counted in ``errors``) when Redis fails or is paused."""
        if time.monotonic() < self._retry_at:
            return None
        try:
            async with asyncio.timeout(self.call_timeout):
                result = await command()
        except Exception as error:  # RedisError, OSError (TLS), TimeoutError; whatever it is, no request fails
            errors.increment(1)
            self._retry_at = time.monotonic() + RETRY_AFTER_S
            if not self._failing:
                self._failing = True
                log.warning("the redis response cache at %s failed (%s: %s); requests are served uncached until it "
                            "answers again", self.settings.address, type(error).__name__, error)
            return None
        if self._failing:
            self._failing = False
            log.info("the redis response cache at %s answers again", self.settings.address)
        return result

    async def close(self) -> None:
        """Let pending inserts finish (each is bounded), then close the connections."""
        if self._inserts:
            await asyncio.gather(*self._inserts, return_exceptions=True)
        await self.client.aclose(close_connection_pool=True)
        self.lookup_errors.release()
        self.insert_errors.release()
