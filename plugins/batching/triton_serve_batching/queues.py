"""The dynamic batcher's request queue: priority levels, each with Triton's queue policy.

Level 1 is the highest priority. Each level holds its requests in arrival order, plus the
requests whose queue timeout expired under ``timeout_action: DELAY``, which run only after
every other request of the level. Expired requests under ``REJECT`` are answered at once.

As in Triton's ``PriorityQueue``, a level exists only while it holds requests, unless it has a
``priority_queue_policy`` of its own: ``priority_levels`` costs nothing until a level is used, up to
the largest value Triton accepts (2**64 - 1).
"""
from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from triton_serve.plugin import InferenceRequest, ModelDynamicBatching, ModelQueuePolicy, ServerError, Status

NO_DEADLINE = 1 << 62


@dataclass(eq=False)
class QueuedRequest:
    """A request waiting in the queue, with its batch size and when its queue timeout expires."""

    request: InferenceRequest
    size: int
    deadline_ns: int
    order: int  # arrival order across all levels


class _Level:
    __slots__ = ("policy", "waiting", "delayed")

    def __init__(self, policy: ModelQueuePolicy) -> None:
        self.policy = policy
        self.waiting: deque[QueuedRequest] = deque()
        self.delayed: deque[QueuedRequest] = deque()

    def __len__(self) -> int:
        return len(self.waiting) + len(self.delayed)


def queue_timeout_us(policy: ModelQueuePolicy, requested_us: int) -> int:
    """Triton's rule for a request's queue timeout (0: none): the policy's
    ``default_timeout_microseconds``, unless ``allow_timeout_override`` is set and the request asks for
    a shorter one (not 0). A request cannot lengthen the timeout, nor set one where the policy has none;
    without ``allow_timeout_override`` its timeout is ignored."""
    timeout_us: int = policy.default_timeout_microseconds
    if policy.allow_timeout_override and 0 < requested_us < timeout_us:
        return requested_us
    return timeout_us


class PriorityQueue:
    """Requests by priority level; ``push`` applies the level's policy, ``expire`` its timeouts."""

    def __init__(self, model_name: str, config: ModelDynamicBatching) -> None:
        self.model_name = model_name
        self.levels_count = config.priority_levels
        self.default_level = config.default_priority_level if config.priority_levels else 1
        self.default_policy = config.default_queue_policy
        kept = dict(config.priority_queue_policy) if config.priority_levels else {}
        kept.setdefault(self.default_level, config.default_queue_policy)  # where most requests go: kept too
        self._kept = frozenset(kept)  # levels that stay when empty; the others come and go with their requests
        self._levels = {level: _Level(policy) for level, policy in kept.items()}
        self._order = sorted(self._levels)  # the levels that exist, highest priority first
        self._size = 0
        self._arrivals = 0
        policies = [config.default_queue_policy, *kept.values()]
        self._timed = any(policy.default_timeout_microseconds for policy in policies)

    def __len__(self) -> int:
        return self._size

    def level_of(self, request: InferenceRequest) -> int:
        """The request's level: its priority, or the default level for priority 0 or one past the
        model's levels (Triton's ``SetPriority``); without priority levels, every request shares one."""
        priority = request.priority
        if priority == 0 or priority > self.levels_count:
            return self.default_level
        return priority

    def push(self, request: InferenceRequest, size: int) -> int:
        """Queue a request and return when its queue timeout expires (``NO_DEADLINE``: never); raise
        ServerError, as Triton, when its level holds ``max_queue_size`` requests."""
        number = self.level_of(request)
        level = self._levels.get(number)
        if level is None:
            level = self._levels[number] = _Level(self.default_policy)
            bisect.insort(self._order, number)
        policy = level.policy
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
            raise ServerError(f"[request id: {request.id or '<id_unknown>'}] Exceeds maximum queue size",
                              Status.UNAVAILABLE)
        timeout_us = queue_timeout_us(policy, request.timeout_us) if self._timed else 0
        deadline = request.enqueued_ns + timeout_us * 1000 if timeout_us else NO_DEADLINE
        level.waiting.append(QueuedRequest(request, size, deadline, self._arrivals))
        self._arrivals += 1
        self._size += 1
        return deadline

    def _levels_in_order(self) -> Iterator[_Level]:
        levels = self._levels
        for number in self._order:
            yield levels[number]

    def _forget_empty_levels(self) -> None:
        """Drop the levels without requests, but those with their own policy (Triton's ``ReadyForErasure``)."""
        if len(self._order) == len(self._kept):
            return
        empty = [number for number in self._order if number not in self._kept and not self._levels[number]]
        for number in empty:
            del self._levels[number]
            self._order.remove(number)

    def expire(self, now_ns: int, reject: Callable[[QueuedRequest], None]) -> None:
        """Apply every level's timeout action to the waiting requests whose deadline has passed."""
        if not self._timed:
            return
        rejected: list[QueuedRequest] = []
        for level in self._levels_in_order():
            if not any(entry.deadline_ns <= now_ns for entry in level.waiting):
                continue
            kept: deque[QueuedRequest] = deque()
            for entry in level.waiting:
                if entry.deadline_ns > now_ns:
                    kept.append(entry)
                elif level.policy.timeout_action == ModelQueuePolicy.DELAY:
                    entry.deadline_ns = NO_DEADLINE
                    level.delayed.append(entry)
                else:
                    rejected.append(entry)
            level.waiting = kept
        if rejected:
            self._size -= len(rejected)
            self._forget_empty_levels()
            for entry in rejected:
                reject(entry)

    def next_deadline(self) -> int:
        """The earliest queue timeout of a waiting request (``NO_DEADLINE``: none)."""
        if not self._timed:
            return NO_DEADLINE
        return min((entry.deadline_ns for level in self._levels_in_order() for entry in level.waiting),
                   default=NO_DEADLINE)

    def in_order(self) -> Iterator[QueuedRequest]:
        """Queued requests in the order batches take them: by level, then waiting before delayed."""
        levels = self._levels
        for number in self._order:
            level = levels[number]
            yield from level.waiting
            yield from level.delayed

    def pop_front(self, count: int) -> list[QueuedRequest]:
        """Take the first ``count`` requests of ``in_order()`` off the queue."""
        taken: list[QueuedRequest] = []
        levels = self._levels
        for number in self._order:
            level = levels[number]
            for lane in (level.waiting, level.delayed):
                while lane and len(taken) < count:
                    taken.append(lane.popleft())
            if len(taken) == count:
                break
        self._size -= len(taken)
        self._forget_empty_levels()
        return taken

    def remove(self, taken: list[QueuedRequest]) -> None:
        ids = {id(entry) for entry in taken}
        for level in self._levels_in_order():
            level.waiting = deque(e for e in level.waiting if id(e) not in ids)
            level.delayed = deque(e for e in level.delayed if id(e) not in ids)
        self._size -= len(taken)
        self._forget_empty_levels()

    def drop_cancelled(self) -> list[QueuedRequest]:
        """Take out the requests whose client cancelled them while they waited."""
        cancelled = [entry for entry in self.in_order() if entry.request.cancelled.is_set()]
        if cancelled:
            self.remove(cancelled)
        return cancelled
