"""The sequence batcher's strategies, ``direct`` and ``oldest``: which slots' next requests form an
instance's next batch, or how long to wait for a better one."""
from __future__ import annotations

from triton_serve.plugin import ModelSequenceBatching

from .slots import Slot


class DirectStrategy:
    """``direct``: every slot with a request joins the batch, unless ``max_queue_delay_microseconds``
    and ``minimum_slot_utilization`` together say to wait for more slots to fill."""

    def __init__(self, settings: ModelSequenceBatching.StrategyDirect, max_batch: int) -> None:
        self._delay_ns = settings.max_queue_delay_microseconds * 1000
        self._utilization = settings.minimum_slot_utilization
        self._max_batch = max_batch

    def pick(self, ready: list[Slot], now_ns: int) -> tuple[list[Slot], float | None]:
        """The slots of ``ready`` whose requests go now, or ``[]`` and how many seconds to wait."""
        if self._delay_ns and self._utilization:
            waited = now_ns - min(slot.next_enqueued_ns() for slot in ready)
            if waited <= self._delay_ns and len(ready) / self._max_batch < self._utilization:
                return [], (self._delay_ns - waited) / 1e9
        return ready, None


class OldestStrategy:
    """``oldest``: a dynamic batch of the oldest next requests of the candidate sequences, at most
    one per sequence, honouring ``preferred_batch_size`` and ``max_queue_delay_microseconds``."""

    def __init__(self, settings: ModelSequenceBatching.StrategyOldest, max_batch: int) -> None:
        self._delay_ns = settings.max_queue_delay_microseconds * 1000
        self._preferred = sorted(settings.preferred_batch_size)
        self._max_batch = max_batch

    def pick(self, ready: list[Slot], now_ns: int) -> tuple[list[Slot], float | None]:
        """The slots of ``ready`` whose requests go now, or ``[]`` and how many seconds to wait."""
        ready = sorted(ready, key=Slot.next_enqueued_ns)
        size = min(len(ready), self._max_batch)
        if size < self._max_batch:
            preferred = [p for p in self._preferred if p <= size]
            if preferred:
                size = preferred[-1]
            elif self._delay_ns:
                waited = now_ns - ready[0].next_enqueued_ns()
                if waited < self._delay_ns:
                    return [], (self._delay_ns - waited) / 1e9
        return ready[:size], None


Strategy = DirectStrategy | OldestStrategy
