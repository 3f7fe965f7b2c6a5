"""The sequence batcher's batch slots: each holds one sequence, a sequence waits in the backlog while
every slot is taken."""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from triton_serve.plugin import InferenceRequest

from .correlation import CorrelationId


class ActiveSequence:
    """One sequence: its queued requests and implicit state; in a slot, or waiting in the backlog."""

    __slots__ = ("corrid", "ended", "requests", "slot", "state")

    def __init__(self, corrid: CorrelationId) -> None:
        self.corrid = corrid
        self.requests: deque[InferenceRequest] = deque()
        self.state: dict[str, np.ndarray] | None = None
        self.ended = False  # END was received or the sequence expired: no more requests will join
        self.slot: Slot | None = None


class Slot:
    """One batch slot of one instance (number ``instance``); holds at most one sequence. ``wake``
    tells the instance's batcher that the slot has work."""

    __slots__ = ("index", "instance", "sequence", "wake")

    def __init__(self, index: int, instance: int, wake: Callable[[], None]) -> None:
        self.index = index
        self.instance = instance
        self.wake = wake
        self.sequence: ActiveSequence | None = None

    def next_enqueued_ns(self) -> int:
        """When the next request of the slot's sequence was queued."""
        return self.sequence.requests[0].enqueued_ns  # type: ignore[union-attr]


class SlotTable:
    """Every instance's slots. A new sequence takes the free slot with the lowest index (on the
    lowest-numbered instance among equals), so sequences spread over the instances; with none free
    it waits in the backlog, and a freed slot goes to the oldest backlogged sequence."""

    def __init__(self, slots: Iterable[Slot]) -> None:
        self._free = [(slot.index, slot.instance, slot) for slot in slots]
        heapq.heapify(self._free)
        self._backlog: deque[ActiveSequence] = deque()

    def place(self, sequence: ActiveSequence) -> None:
        """Give a new sequence a free slot, or a place in the backlog."""
        if not self._free:
            self._backlog.append(sequence)
            return
        _, _, slot = heapq.heappop(self._free)
        slot.sequence, sequence.slot = sequence, slot

    def release(self, slot: Slot) -> None:
        """Free a slot: the oldest backlogged sequence takes it, else it waits for a new sequence."""
        slot.sequence = None
        if self._backlog:
            sequence = self._backlog.popleft()
            slot.sequence, sequence.slot = sequence, slot
            slot.wake()
        else:
            heapq.heappush(self._free, (slot.index, slot.instance, slot))
