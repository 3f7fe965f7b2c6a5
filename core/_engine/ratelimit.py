"""Triton's rate limiter: an instance executes only once it holds the resources its config names.

With ``--rate-limit=execution_count`` every instance's ``rate_limiter { resources [...] priority }``
is honoured across all models: a resource is per device unless marked ``global``, and its
available count is set with ``--rate-limit-resource=<name>:<count>[:<device>]`` or else is the
largest count any one instance asks for. Among waiting instances, one with ``priority: 2`` gets
half the turns of one with ``priority: 1``. With ``--rate-limit=off`` (the default) nothing waits.
"""
from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from .backend import InstanceSpec
from .errors import ServerError

GLOBAL_DEVICE = -1


@dataclass(eq=False)
class ResourceClaim:
    """What one instance needs before each execution: counts by (resource, device), and its priority."""

    instance_name: str
    needs: dict[tuple[str, int], int]
    priority: int = 1
    turns: int = 0


@dataclass(eq=False)
class _Waiter:
    claim: ResourceClaim
    future: asyncio.Future[None] = field(repr=False)


class RateLimiter:
    """Shared by every model of a server; ``InstancePool`` acquires a claim around each execution."""

    def __init__(self, enabled: bool = False, limits: Mapping[tuple[str, int | None], int] | None = None) -> None:
        self.enabled = enabled
        self._limits = dict(limits or {})  # device None: the same count on every device
        self._total: dict[tuple[str, int], int] = {}
        self._in_use: dict[tuple[str, int], int] = {}
        self._waiters: list[_Waiter] = []

    def claim(self, model_name: str, instance: InstanceSpec) -> ResourceClaim:
        """The claim of one instance; raises if an explicit limit is below what it needs."""
        config = instance.group.rate_limiter
        needs: dict[tuple[str, int], int] = {}
        for resource in config.resources:
            device = GLOBAL_DEVICE if getattr(resource, "global") else instance.device_id
            needs[(resource.name, device)] = needs.get((resource.name, device), 0) + resource.count
        for key, count in needs.items():
            limit = self._explicit_limit(key)
            if limit is not None and count > limit:
                where = "global" if key[1] == GLOBAL_DEVICE else f"device {key[1]}"
                raise ServerError(
                    f"failed to load '{model_name}': instance '{instance.name}' needs {count} of rate limiter "
                    f"resource '{key[0]}' ({where}), but --rate-limit-resource allows only {limit}")
            self._total[key] = max(self._total.get(key, 0), limit if limit is not None else count)
        return ResourceClaim(instance.name, needs, max(config.priority, 1))

    def _explicit_limit(self, key: tuple[str, int]) -> int | None:
        name, device = key
        if (name, device) in self._limits:
            return self._limits[(name, device)]
        return self._limits.get((name, None))

    def _fits(self, claim: ResourceClaim) -> bool:
        return all(self._in_use.get(key, 0) + count <= self._total[key] for key, count in claim.needs.items())

    async def acquire(self, claim: ResourceClaim) -> None:
        """Wait until ``claim``'s resources are free, then hold them."""
        if not self.enabled:
            return
        if not self._waiters and self._fits(claim):
            self._take(claim)
            return
        waiter = _Waiter(claim, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif waiter.future.done() and not waiter.future.cancelled():
                self.release(claim)
            raise

    def release(self, claim: ResourceClaim) -> None:
        """Give back ``claim``'s resources and start whichever waiters now fit, fairest first."""
        if not self.enabled:
            return
        for key, count in claim.needs.items():
            self._in_use[key] -= count
        for waiter in sorted(self._waiters, key=lambda w: (w.claim.turns + 1) * w.claim.priority):
            if waiter.future.done():
                self._waiters.remove(waiter)
            elif self._fits(waiter.claim):
                self._waiters.remove(waiter)
                self._take(waiter.claim)
                waiter.future.set_result(None)

    def _take(self, claim: ResourceClaim) -> None:
        claim.turns += 1
        for key, count in claim.needs.items():
            self._in_use[key] = self._in_use.get(key, 0) + count


def parse_resource_flag(value: str) -> tuple[tuple[str, int | None], int]:
    """``<name>:<count>[:<device>]`` from ``--rate-limit-resource``."""
    parts = value.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"--rate-limit-resource expects <name>:<count>[:<device>], got '{value}'")
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ValueError(f"--rate-limit-resource count and device must be integers, got '{value}'") from None
    if count < 0:
        raise ValueError(f"--rate-limit-resource count must not be negative, got '{value}'")
    return (parts[0], device), count
