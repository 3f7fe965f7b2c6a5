"""Built-in response cache: an in-memory LRU bounded by total tensor bytes (``--cache-config local,size=N``)."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from ..caching import ResponseCache
from ..errors import ServerError
from ..hookspecs import hookimpl
from ..inference import InferenceResponse
from ..registry import CacheRegistry


def _response_bytes(response: InferenceResponse) -> int:
    return sum(t.data.nbytes if t.data.dtype.kind != "O" else sum(len(x) for x in t.data.ravel())
               for t in response.outputs)


class LocalResponseCache(ResponseCache):
    """Least-recently-used entries are evicted once the cached outputs exceed ``size`` bytes."""

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)
        try:
            self.capacity = int(options.get("size", str(1 << 26)))
        except ValueError:
            raise ServerError(f"--cache-config local,size must be a byte count, got '{options['size']}'") from None
        self._entries: OrderedDict[str, tuple[InferenceResponse, int]] = OrderedDict()
        self._used = 0

    def lookup(self, key: str) -> InferenceResponse | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def insert(self, key: str, response: InferenceResponse) -> None:
        size = _response_bytes(response)
        if size > self.capacity or key in self._entries:
            return
        self._entries[key] = (response, size)
        self._used += size
        while self._used > self.capacity:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._used -= evicted


@hookimpl
def tserve_register_caches(registry: CacheRegistry) -> None:
    registry.add("local", LocalResponseCache)
