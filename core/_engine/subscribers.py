"""Callbacks told of a changed value, awaited where they return something (the front-end processes' acks)."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Subscribers(Generic[T]):
    """Subscribers to one value: ``notify`` calls each with the new value, then awaits what they returned."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[T], Awaitable[None] | None]] = []

    def add(self, subscriber: Callable[[T], Awaitable[None] | None]) -> None:
        self._callbacks.append(subscriber)

    async def notify(self, value: T) -> None:
        """Call every subscriber (all before any is awaited, so they proceed together), then await them."""
        for applied in [subscriber(value) for subscriber in self._callbacks]:
            if applied is not None:
                await applied
