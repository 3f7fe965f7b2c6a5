"""Triton's batch-forming rule (``DynamicBatchScheduler::GetDynamicBatch`` in Triton's core), as a
pure function of the queue, for an idle instance.

The queue is walked in order. The batch grows while the next request fits ``max_batch_size`` and
has the first request's shapes. The *best* batch is the largest one whose size is a preferred
size; if none is, and the queue goes past the largest preferred size, it is the largest batch that
fits the largest preferred size. Unless the oldest request walked has waited
``max_queue_delay_microseconds``, the best batch goes at once and the rest of the queue waits.
Otherwise the whole batch goes at once when the next request cannot join it, when it reaches the
largest preferred size, when the delay has passed, or when the delay is 0; else nothing goes
until the oldest request's delay runs out (or a new request arrives).

As in Triton's model-config normalization, no ``preferred_batch_size`` means ``[max_batch_size]``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .queues import NO_DEADLINE, QueuedRequest


@dataclass(frozen=True)
class BatchRule:
    """One model's batch-forming settings."""

    max_batch_size: int
    preferred: frozenset[int]
    max_delay_ns: int

    @classmethod
    def of(cls, max_batch_size: int, preferred: Sequence[int], max_delay_us: int) -> BatchRule:
        max_batch_size = max(max_batch_size, 1)
        return cls(max_batch_size, frozenset(preferred) or frozenset({max_batch_size}), max_delay_us * 1000)

    @property
    def max_preferred(self) -> int:
        return max(self.preferred)


@dataclass(frozen=True)
class Plan:
    """How many requests (a prefix of the queue order) go now; with 0, when to look again
    (``NO_DEADLINE``: only when a request arrives)."""

    count: int
    wait_until_ns: int = NO_DEADLINE


def plan_batch(queue: Iterable[QueuedRequest], rule: BatchRule,
               compatible: Callable[[QueuedRequest, QueuedRequest], bool], now_ns: int,
               flush: bool = False) -> Plan:
    """The batch Triton would send now from ``queue`` (in batch order). ``flush`` sends what fits
    without waiting for the delay (the batcher is stopping)."""
    max_preferred = rule.max_preferred
    first: QueuedRequest | None = None
    count = total = best = 0
    blocked = False  # the walk stopped at a request that cannot join the batch
    oldest = NO_DEADLINE
    for entry in queue:
        if first is None:
            first = entry
        else:
            grown = total + entry.size
            if grown > max_preferred and not best:
                best = count
            if grown > rule.max_batch_size or not compatible(first, entry):
                blocked = True
                break
        count += 1
        total += entry.size
        oldest = min(oldest, entry.request.enqueued_ns)
        if total in rule.preferred:
            best = count
    if not count:
        return Plan(0)
    delay_passed = rule.max_delay_ns > 0 and now_ns - oldest >= rule.max_delay_ns
    if best and not delay_passed:
        return Plan(best)
    if blocked or total >= max_preferred or delay_passed or not rule.max_delay_ns or flush:
        return Plan(count)
    return Plan(0, oldest + rule.max_delay_ns)
