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
    from .frontend.http_apps import HttpAppRegistry
    from .registry import BackendRegistry, CacheRegistry, CommandRegistry, RepositoryAgentRegistry, SchedulerRegistry
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


# ---- repository agents ---------------------------------------------------------------------

@hookspec
def tserve_register_repository_agents(registry: RepositoryAgentRegistry) -> None:
    """Register repository agents: ``registry.add("checksum", ChecksumAgent)``.

    Called once at start-up. A model whose config has ``model_repository_agents { agents [{ name: "<name>"
    parameters {...} }] }`` gets one agent from each named factory (called with no arguments) per load,
    and each is told of the load and unload in Triton's order (see RepositoryAgent). A name another plugin
    registered raises an error naming both.
    """


# ---- repository sources --------------------------------------------------------------------

@hookspec(firstresult=True)
def tserve_repository_source(location: str) -> RepositorySource | None:
    """Return a RepositorySource for a ``--model-repository`` location this plugin understands
    (a local path, ``s3://...``), or None to let another plugin try.

    Called once per location at start-up; stops at the first non-None result.
    """


# ---- commands ------------------------------------------------------------------------------

@hookspec
def tserve_register_commands(registry: CommandRegistry) -> None:
    """Register ``triton-serve`` subcommands: ``registry.add("analyze", main, "tune a model's configuration")``.

    Called by the ``triton-serve`` command line (not by a running server), once, when its first argument
    is not a flag. ``main`` is called as ``main(argv)`` with the arguments after the command's name and
    returns the process's exit status; the one-line help is what ``triton-serve plugins`` prints. A name
    another plugin (or the built-in ``plugins`` command) already took raises an error naming both.
    """


# ---- HTTP apps -----------------------------------------------------------------------------

@hookspec
def tserve_register_http_apps(registry: HttpAppRegistry) -> None:
    """Serve more paths on the HTTP port: ``registry.add("/v1/", make_app)``.

    Called once at start-up by the server, and again in each front-end process (``--frontend-processes``),
    which loads only the installed plugins that registered a prefix. ``make_app(api, max_input_size)`` returns
    an ASGI app that gets every HTTP request whose path starts with the prefix; it reaches models only through
    ``api``, the data-plane seam (a DataPlaneAPI). A prefix another plugin took raises an error naming both.
    ``registry.add(prefix, make_app, openai_options=True)`` calls ``make_app(api, max_input_size, options)``
    with the ``--openai-*`` flags (OpenAIOptions) and serves the app on ``--openai-port`` too.
    """
