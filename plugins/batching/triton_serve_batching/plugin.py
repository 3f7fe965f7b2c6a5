"""Registers the schedulers of this package through the core's scheduler hook."""
from __future__ import annotations

from triton_serve.plugin import SchedulerRegistry, hookimpl

from .dynamic import DynamicBatcher
from .sequence import SequenceBatcher


@hookimpl
def tserve_register_schedulers(registry: SchedulerRegistry) -> None:
    registry.add("dynamic_batching", DynamicBatcher)
    registry.add("sequence_batching", SequenceBatcher)
