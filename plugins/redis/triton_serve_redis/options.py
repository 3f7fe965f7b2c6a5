"""``--cache-config redis,<key>=<value>``: Triton's redis cache keys, checked, as redis-py connection settings."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from triton_serve.plugin import ServerError, Status, parse_bool

# Triton's redis cache (triton-inference-server/redis_cache, src/redis_cache.cc) reads these keys.
CONNECTION_KEYS = ("host", "port", "user", "password", "db", "connect_timeout", "socket_timeout", "pool_size",
                   "wait_timeout")
TLS_KEYS = ("tls_enabled", "cert", "key", "cacert", "cacert_dir", "sni")
ALIASES = {"username": "user"}  # ours: redis-py's and the Redis ACL's word for it
# Triton reads the credentials from these when the config leaves them out.
USERNAME_ENV = "TRITONCACHE_REDIS_USERNAME"
PASSWORD_ENV = "TRITONCACHE_REDIS_PASSWORD"
NO_ADDRESS = ("Failed to initialize RedisCache, didn't specify address. Must at a minimum specify 'host' and 'port' "
              "in the configuration - e.g. tritonserver --cache-config redis,host=redis --cache-config "
              "redis,port=6379 --model-repository=/models ...")
# Triton's 0 (connect_timeout, socket_timeout) waits forever; a request here never waits on Redis longer than this.
LONGEST_WAIT_MS = 1000


def _error(message: str) -> ServerError:
    return ServerError(f"--cache-config redis: {message}", Status.INVALID_ARG)


def _whole(key: str, text: str, what: str, minimum: int = 0) -> int:
    value = int(text) if text.isdigit() else -1
    if value < minimum:
        raise _error(f"'{key}' must be {what} ({minimum} or more), got '{text}'")
    return value


@dataclass(frozen=True)
class RedisSettings:
    """The cache's connection, as its keys set it (times in milliseconds, 0 as Triton: no limit of its own)."""

    host: str
    port: int
    user: str | None = None
    password: str | None = None
    db: int = 0
    connect_timeout: int = 0
    socket_timeout: int = 0
    pool_size: int = 1
    wait_timeout: int = 1000
    tls_enabled: bool = False
    cert: str | None = None
    key: str | None = None
    cacert: str | None = None
    cacert_dir: str | None = None
    sni: str | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def seconds(self, milliseconds: int) -> float:
        """A timeout in seconds for redis-py: Triton's 0 (none) becomes LONGEST_WAIT_MS."""
        return (milliseconds or LONGEST_WAIT_MS) / 1000

    def connection_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of a redis-py connection (sync or asyncio) to this server."""
        kwargs: dict[str, Any] = {
            "host": self.host, "port": self.port, "db": self.db, "username": self.user, "password": self.password,
            "socket_connect_timeout": self.seconds(self.connect_timeout),
            "socket_timeout": self.seconds(self.socket_timeout),
        }
        if self.tls_enabled:
            kwargs.update(ssl=True, ssl_certfile=self.cert, ssl_keyfile=self.key, ssl_ca_certs=self.cacert,
                          ssl_ca_path=self.cacert_dir)
        return kwargs


def parse_settings(options: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> RedisSettings:
    """Check ``options`` as Triton's redis cache reads them, and more strictly: an unknown key, a port that is not
    one, or a number or boolean that does not parse fails the start with an error naming the key."""
    given = {}
    for name, value in options.items():
        key = ALIASES.get(name, name)
        if key not in CONNECTION_KEYS and key not in TLS_KEYS:
            raise _error(f"unknown key '{name}' (the keys: {', '.join(CONNECTION_KEYS + TLS_KEYS)})")
        given[key] = value
    if "host" not in given or "port" not in given:
        raise ServerError(NO_ADDRESS, Status.INVALID_ARG)
    if not given["host"]:
        raise _error("'host' is empty")
    port = int(given["port"]) if given["port"].isdigit() else 0
    if not 0 < port < 65536:
        raise _error(f"'port' must be a port number (1 to 65535), got '{given['port']}'")
    settings: dict[str, Any] = {"host": given["host"], "port": port,
                                "user": environ.get(USERNAME_ENV), "password": environ.get(PASSWORD_ENV)}
    for key in ("user", "password"):
        if key in given:
            settings[key] = given[key]
    if "db" in given:
        settings["db"] = _whole("db", given["db"], "a database number")
    for key in ("connect_timeout", "socket_timeout", "wait_timeout"):
        if key in given:
            settings[key] = _whole(key, given[key], "a whole number of milliseconds")
    if "pool_size" in given:
        settings["pool_size"] = _whole("pool_size", given["pool_size"], "a number of connections", 1)
    if "tls_enabled" in given:  # Triton reads the other TLS keys only with tls_enabled
        try:
            settings["tls_enabled"] = parse_bool(given["tls_enabled"])
        except ValueError:
            raise _error(f"'tls_enabled' must be true or false, got '{given['tls_enabled']}'") from None
        for key in TLS_KEYS[1:]:
            if key in given:
                settings[key] = given[key]
        sni = settings.get("sni")
        if sni is not None and sni != settings["host"]:
            # redis-py names the server it connects to (host) in the TLS handshake.
            raise _error(f"'sni' must be the host name ('{settings['host']}') here, got '{sni}'")
    return RedisSettings(**settings)
