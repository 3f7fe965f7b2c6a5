"""Registers the ensemble scheduler through the core's scheduler hook."""
from __future__ import annotations

from triton_serve.plugin import SchedulerRegistry, hookimpl

from .scheduler import EnsembleScheduler


@hookimpl
def tserve_register_schedulers(registry: SchedulerRegistry) -> None:
    registry.add("ensemble_scheduling", EnsembleScheduler)
