"""The plugin host: finds plugins (built-ins first, then entry points), checks them, fills the registries."""
from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pluggy

from .. import __version__
from . import hookspecs
from .errors import ServerError, Status
from .frontend.http_apps import HttpAppRegistry
from .registry import (BackendRegistry, CacheRegistry, CommandRegistry, Registry, RepositoryAgentRegistry,
                       SchedulerRegistry)
from .sources import RepositorySource

log = logging.getLogger("triton_serve")

ENTRY_POINT_GROUP = "triton_serve"
DISABLE_AUTOLOAD_ENV = "TRITON_SERVE_DISABLE_PLUGIN_AUTOLOAD"
PLUGINS_ENV = "TRITON_SERVE_PLUGINS"

# Registered first, so installed plugins (registered later, called earlier) can take over their names.
DEFAULT_PLUGINS: tuple[tuple[str, str], ...] = (
    ("local_source", "triton_serve._engine.builtins.local_source"),
    ("passthrough_scheduler", "triton_serve._engine.builtins.passthrough"),
    ("local_cache", "triton_serve._engine.builtins.local_cache"),
    ("checksum_agent", "triton_serve._engine.builtins.checksum_agent"),
)


@dataclass
class PluginInfo:
    """What ``triton-serve plugins`` prints about one plugin."""

    name: str
    distribution: str
    version: str
    hooks: list[str]
    # Why it is not registered: its module failed to import, or its package has no entry point (it is used
    # another way, e.g. triton-serve-ray's own deployment command); empty for a registered plugin.
    note: str = ""


class PluginHost:
    """Owns the pluggy manager and the registries built from it.

    ``blocked`` names plugins never to register (``--plugin no:NAME``); ``extra`` adds plugin
    objects directly (tests, embedding). Entry points load unless ``TRITON_SERVE_DISABLE_PLUGIN_AUTOLOAD``
    is set; ``TRITON_SERVE_PLUGINS=a,b`` loads only the named entry points.
    """

    def __init__(self, *, blocked: Iterable[str] = (), extra: Iterable[tuple[str, Any]] = ()) -> None:
        self.pm = pluggy.PluginManager("triton_serve")
        self.pm.add_hookspecs(hookspecs)
        for name in blocked:
            self.pm.set_blocked(name)
        self._builtin_names = {name for name, _ in DEFAULT_PLUGINS}
        self.broken: dict[str, str] = {}  # entry point name -> why its module did not import
        for name, module in DEFAULT_PLUGINS:
            if not self.pm.is_blocked(name):
                self.pm.register(importlib.import_module(module), name=name)
        self._load_entry_points()
        for name, plugin in extra:
            self._register_extra(name, plugin)
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as error:
            raise ServerError(f"plugin '{error.plugin}' is invalid: {error}", Status.INTERNAL) from error
        self.backends = BackendRegistry()
        self.schedulers = SchedulerRegistry()
        self.caches = CacheRegistry()
        self._register("tserve_register_backends", self.backends)
        self._register("tserve_register_schedulers", self.schedulers)
        self._register("tserve_register_caches", self.caches)
        self.repository_agents = RepositoryAgentRegistry()
        self._register("tserve_register_repository_agents", self.repository_agents)
        self.http_apps = HttpAppRegistry()
        self._register("tserve_register_http_apps", self.http_apps)
        self._commands: CommandRegistry | None = None

    @property
    def commands(self) -> CommandRegistry:
        """The subcommands plugins add to ``triton-serve`` (collected on first use: a server never asks)."""
        if self._commands is None:
            self._commands = CommandRegistry()
            self._register("tserve_register_commands", self._commands)
        return self._commands

    def _load_entry_points(self) -> None:
        """Register each installed entry point; one whose module fails to import is logged and left out (in
        ``broken``), so the models of the other plugins still serve."""
        if os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip() not in ("", "0", "false"):
            return
        wanted = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
        available = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
        for name in wanted:
            if name not in available:
                raise ServerError(f"{PLUGINS_ENV} names plugin '{name}', but no installed package provides it "
                                  f"(installed: {', '.join(available) or 'none'})", Status.NOT_FOUND)
        for name in wanted or available:
            try:
                self.pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
            except Exception as error:  # an installed plugin's own bug or missing dependency
                self.broken[name] = f"{type(error).__name__}: {error}"
                log.error("plugin '%s' is left out: its module failed to import (%s)", name, self.broken[name])

    def _register_extra(self, name: str, plugin: Any) -> None:
        """Register a plugin object given in code; one whose name or object is registered already (an
        installed package's entry point, most often) is an error saying by whom."""
        holder = self.pm.get_name(plugin)
        taken = holder if holder is not None else name
        if holder is None and self.pm.get_plugin(name) is None:
            self.pm.register(plugin, name=name)
            return
        what = "is already registered" if holder is not None else "has a name already taken"
        raise ServerError(f"extra plugin '{name}' ({plugin!r}) {what}: plugin '{taken}' comes from "
                          f"{self._origin(taken)}. An installed plugin is registered through its entry point "
                          "and needs no extra_plugins entry; to register another object in its place, block "
                          f"it (blocked_plugins / --plugin no:{taken}) and give yours another name",
                          Status.ALREADY_EXISTS)

    def _origin(self, name: str) -> str:
        """Where a registered plugin comes from, in words."""
        plugin = self.pm.get_plugin(name)
        for registered, dist in self.pm.list_plugin_distinfo():
            if registered is plugin:
                return f"the '{name}' entry point of installed package {dist.metadata['name']} {dist.version}"
        return "the built-in plugins" if name in self._builtin_names else "an earlier extra_plugins entry"

    def _register(self, hook_name: str, registry: Registry[Any] | HttpAppRegistry) -> None:
        # Call each implementation ourselves (in pluggy's order) so the registry knows who adds what.
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls()[::-1]:
            registry.current_plugin = impl.plugin_name
            registry.current_is_builtin = impl.plugin_name in self._builtin_names
            impl.function(registry=registry)

    def repository_source(self, location: str) -> RepositorySource:
        """The source for one ``--model-repository`` location."""
        source = self.pm.hook.tserve_repository_source(location=location)
        if source is None:
            raise ServerError(f"no repository-source plugin understands model repository '{location}'",
                              Status.NOT_FOUND)
        return source

    def describe(self) -> list[PluginInfo]:
        """Every registered plugin with its distribution, version and implemented hooks."""
        dists = {id(plugin): dist for plugin, dist in self.pm.list_plugin_distinfo()}
        infos = []
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:
                continue
            dist = dists.get(id(plugin))
            if dist is not None:
                dist_name, version = dist.metadata["name"], dist.version
            elif name in self._builtin_names:
                dist_name, version = "triton-serve (built-in)", __version__
            else:
                dist_name, version = "(registered directly)", ""
            hooks = sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or [])
            infos.append(PluginInfo(name, dist_name, version, hooks))
        for installed in importlib.metadata.distributions():
            dist_name = installed.metadata["name"] or ""
            points = [ep.name for ep in installed.entry_points if ep.group == ENTRY_POINT_GROUP]
            for name in points:
                if name in self.broken:
                    infos.append(PluginInfo(name, dist_name, installed.version, [],
                                            f"failed to import: {self.broken[name]}"))
            if dist_name.startswith("triton-serve-") and not points:
                summary = installed.metadata["summary"] or "used through its own API"
                infos.append(PluginInfo(dist_name.removeprefix("triton-serve-"), dist_name, installed.version, [],
                                        f"no hooks: {summary}"))
        return infos

