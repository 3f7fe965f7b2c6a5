"""The dynamic batcher's request queue: priority levels, each with Triton's queue policy.

Level 1 is the highest priority. Each level holds its requests in arrival order, plus the
requests whose queue timeout expired under ``timeout_action: DELAY``, which run only after
every other request of the level. Expired requests under ``REJECT`` are answered at once.
"""
from __future__ import annotations

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
    def __init__(self, policy: ModelQueuePolicy) -> None:
        self.policy = policy
        self.waiting: deque[QueuedRequest] = deque()
        self.delayed: deque[QueuedRequest] = deque()

    def __len__(self) -> int:
        return len(self.waiting) + len(self.delayed)


class PriorityQueue:
    """Requests by priority level; ``push`` applies the level's policy, ``expire`` its timeouts."""

    def __init__(self, model_name: str, config: ModelDynamicBatching) -> None:
        self.model_name = model_name
        self.levels_count = config.priority_levels
        self.default_level = config.default_priority_level if config.priority_levels else 1
        self._levels: dict[int, _Level] = {}
        for level in range(1, max(self.levels_count, 1) + 1):
            policy = config.priority_queue_policy.get(level, config.default_queue_policy)
            self._levels[level] = _Level(policy)
        self._arrivals = 0
        self._timed = any(level.policy.default_timeout_microseconds or level.policy.allow_timeout_override
                          for level in self._levels.values())

    def __len__(self) -> int:
        return sum(len(level) for level in self._levels.values())

    def level_of(self, request: InferenceRequest) -> int:
        """The request's level: its priority (0 means the default level). Without priority levels
        configured, every request shares one level and the priority is ignored, as in Triton."""
        if not self.levels_count:
            return 1
        if request.priority == 0:
            return self.default_level
        if request.priority > self.levels_count:
            raise ServerError(f"inference request to model '{self.model_name}' has priority {request.priority}, "
                              f"but the model's priority levels are 1 to {self.levels_count} (0 for the default)")
        return request.priority

    def push(self, request: InferenceRequest, size: int) -> None:
        """Queue a request or raise: an invalid priority or timeout override, or a full level."""
        level = self._levels[self.level_of(request)]
        policy = level.policy
        timeout_us = policy.default_timeout_microseconds
        if request.timeout_us:
            if not policy.allow_timeout_override:
                raise ServerError(f"inference request to model '{self.model_name}' sets a queue timeout, "
                                  "but the model's queue policy does not allow a timeout override "
                                  "(allow_timeout_override is false)")
            timeout_us = request.timeout_us
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
            raise ServerError("Exceeds maximum queue size", Status.UNAVAILABLE)
        deadline = request.enqueued_ns + timeout_us * 1000 if timeout_us else NO_DEADLINE
        level.waiting.append(QueuedRequest(request, size, deadline, self._arrivals))
        self._arrivals += 1

    def expire(self, now_ns: int, reject: Callable[[QueuedRequest], None]) -> None:
        """Apply every level's timeout action to the waiting requests whose deadline has passed."""
        if not self._timed:
            return
        for level in self._levels.values():
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
                    reject(entry)
            level.waiting = kept

    def next_deadline(self) -> int:
        """The earliest queue timeout of a waiting request (``NO_DEADLINE``: none)."""
        if not self._timed:
            return NO_DEADLINE
        return min((entry.deadline_ns for level in self._levels.values() for entry in level.waiting),
                   default=NO_DEADLINE)

    def in_order(self) -> Iterator[QueuedRequest]:
        """Queued requests in the order batches take them: by level, then waiting before delayed."""
        for level in self._levels.values():
            yield from level.waiting
            yield from level.delayed

    def pop_front(self, count: int) -> list[QueuedRequest]:
        """Take the first ``count`` requests of ``in_order()`` off the queue."""
        taken: list[QueuedRequest] = []
        for level in self._levels.values():
            for lane in (level.waiting, level.delayed):
                while lane and len(taken) < count:
                    taken.append(lane.popleft())
        return taken

    def remove(self, taken: list[QueuedRequest]) -> None:
        ids = {id(entry) for entry in taken}
        for level in self._levels.values():
            level.waiting = deque(e for e in level.waiting if id(e) not in ids)
            level.delayed = deque(e for e in level.delayed if id(e) not in ids)

    def drop_cancelled(self) -> list[QueuedRequest]:
        """Take out the requests whose client cancelled them while they waited."""
        cancelled = [entry for entry in self.in_order() if entry.request.cancelled.is_set()]
        if cancelled:
            self.remove(cancelled)
        return cancelled
