"""The response cache API: caches plug in by name and are chosen with ``--cache-config``."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from .inference import InferenceResponse


class ResponseCache(ABC):
    """Stores responses of models whose config sets ``response_cache { enable: true }``.

    Keys are hex digests of the model, version, inputs and requested outputs. Called on the event loop.
    """

    #: A remote cache's lookups wait on another server (Redis): the data plane then awaits ``fetch`` in a task of
    #: its own, and the request waits there, not the event loop. A local cache answers ``lookup`` at once.
    remote: ClassVar[bool] = False

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)

    @abstractmethod
    def lookup(self, key: str) -> InferenceResponse | None:
        """The cached response for ``key``, or None on a miss."""

    @abstractmethod
    def insert(self, key: str, response: InferenceResponse) -> None:
        """Remember a successful response; it must not wait (a remote cache stores it in a task of its own)."""

    async def fetch(self, key: str) -> InferenceResponse | None:
        """A remote cache's lookup, awaited on the event loop. It must return within a bounded time and never
        raise: on any failure it answers None (a miss), and the request runs uncached."""
        return self.lookup(key)

    async def close(self) -> None:
        """Release connections and finish pending work; awaited once when the server stops."""
