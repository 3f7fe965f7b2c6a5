"""The response cache API: caches plug in by name and are chosen with ``--cache-config``."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from .inference import InferenceResponse


class ResponseCache(ABC):
    """Stores responses of models whose config sets ``response_cache { enable: true }``.

    Keys are hex digests of the model, version, inputs and requested outputs. Called on the event loop.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)

    @abstractmethod
    def lookup(self, key: str) -> InferenceResponse | None:
        """The cached response for ``key``, or None on a miss."""

    @abstractmethod
    def insert(self, key: str, response: InferenceResponse) -> None:
        """Remember a successful response."""
