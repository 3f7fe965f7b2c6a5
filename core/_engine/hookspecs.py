"""Every hook a triton-serve plugin can implement.

Hooks wire objects together at start-up; no hook is called on the request path.
Registration hooks receive a registry and only call ``registry.add``. pluggy calls the
last registered plugin first: installed plugins run before the built-ins, so a plugin
that registers a name a built-in also uses takes it over.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .registry import BackendRegistry, CacheRegistry, SchedulerRegistry
    from .sources import RepositorySource

hookspec = pluggy.HookspecMarker("triton_serve")
hookimpl = pluggy.HookimplMarker("triton_serve")


# ---- backends ------------------------------------------------------------------------------

@hookspec
def tserve_register_backends(registry: BackendRegistry) -> None:
    """Register backend classes: ``registry.add(MyBackend)``.

    Called once at start-up, by the plugin host, for every plugin. Each class is registered under
    its ``name`` (``config.backend``) and its ``platforms`` (``config.platform``). Registering a
    name another installed plugin already took raises an error naming both plugins.
    """


# ---- schedulers ----------------------------------------------------------------------------

@hookspec
def tserve_register_schedulers(registry: SchedulerRegistry) -> None:
    """Register scheduler factories: ``registry.add("dynamic_batching", DynamicBatcher)``.

    Called once at start-up. The kind is one of "default" (configs with no scheduling choice),
    "dynamic_batching" or "sequence_batching"; the factory is called as ``factory(context)`` for
    each model version that loads (a ModelContext: the version's spec, InstancePool, statistics and
    an InferenceClient for requests to other models) and returns a Scheduler.
    """


# ---- response caches -----------------------------------------------------------------------

@hookspec
def tserve_register_caches(registry: CacheRegistry) -> None:
    """Register response caches: ``registry.add("local", LocalResponseCache)``.

    Called once at start-up. ``--cache-config=<name>,<key>=<value>`` picks one by name; the factory
    is called once with the options as a dict of strings and returns a ResponseCache.
    """


# ---- repository sources --------------------------------------------------------------------

@hookspec(firstresult=True)
def tserve_repository_source(location: str) -> RepositorySource | None:
    """Return a RepositorySource for a ``--model-repository`` location this plugin understands
    (a local path, ``s3://...``), or None to let another plugin try.

    Called once per location at start-up; stops at the first non-None result.
    """
