"""The plugin behind the ``redis_cache`` entry point: registers the ``redis`` response cache."""
from __future__ import annotations

from triton_serve.plugin import CacheRegistry, hookimpl

from .cache import RedisResponseCache


@hookimpl
def tserve_register_caches(registry: CacheRegistry) -> None:
    registry.add("redis", RedisResponseCache)
