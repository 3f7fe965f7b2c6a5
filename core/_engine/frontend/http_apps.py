"""Plugin apps on the HTTP port (the ``tserve_register_http_apps`` hook): their registry, and how a front-end
process finds them again. Imported by front-end processes, so it imports nothing of the model owner's."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import pluggy

from .. import hookspecs
from ..errors import ServerError, Status
from .http.error_guard import App as AsgiApp

if TYPE_CHECKING:
    from .openai_listener import OpenAIOptions
    from ..seam import DataPlaneAPI

# (the data-plane seam, --http-max-input-size) -> the ASGI app serving a plugin's paths.
HttpAppFactory = Callable[["DataPlaneAPI", int], AsgiApp]
# The same, given the --openai-* flags too (``add(..., openai_options=True)``).
OpenAIAppFactory = Callable[["DataPlaneAPI", int, "OpenAIOptions"], AsgiApp]

ENTRY_POINT_GROUP = "triton_serve"  # the plugin host's group (pluginhost.ENTRY_POINT_GROUP)


class HttpAppRegistry:
    """ASGI app factories by the HTTP path prefix (``/v1/``) their apps serve."""

    def __init__(self) -> None:
        # prefix -> (factory, whether it takes the --openai-* flags)
        self._items: dict[str, tuple[Callable[..., AsgiApp], bool]] = {}
        self._owners: dict[str, str] = {}
        self.current_plugin = "<direct>"
        self.current_is_builtin = False

    def add(self, prefix: str, factory: HttpAppFactory | OpenAIAppFactory, *, openai_options: bool = False) -> None:
        """Serve every HTTP path that starts with ``prefix`` (and the prefix without its last ``/``) from
        ``factory(api, max_input_size)``, an ASGI app built once per front-end; with ``openai_options``,
        ``factory(api, max_input_size, options)`` gets the ``--openai-*`` flags too (``OpenAIOptions``). A prefix
        that does not start and end with ``/``, or that overlaps Triton's ``/v2`` endpoints, is a ValueError; one
        another plugin took is a ServerError naming both."""
        if not (prefix.startswith("/") and prefix.endswith("/") and len(prefix) > 1):
            raise ValueError(f"an HTTP path prefix starts and ends with '/', got '{prefix}'")
        if prefix.startswith("/v2/") or "/v2/".startswith(prefix):
            raise ValueError(f"HTTP path prefix '{prefix}' overlaps Triton's /v2 endpoints")
        if prefix in self._items:
            raise ServerError(f"HTTP path prefix '{prefix}' is registered by both plugin '{self._owners[prefix]}' "
                              f"and plugin '{self.current_plugin}'", Status.ALREADY_EXISTS)
        self._items[prefix] = (factory, openai_options)
        self._owners[prefix] = self.current_plugin

    def get(self, prefix: str) -> HttpAppFactory | OpenAIAppFactory | None:
        """The factory registered for ``prefix``, or None."""
        item = self._items.get(prefix)
        return item[0] if item is not None else None

    def names(self) -> list[str]:
        """The registered prefixes, sorted."""
        return sorted(self._items)

    def plugins(self) -> list[str]:
        """The plugins that registered a prefix (what a front-end process loads again)."""
        return sorted(set(self._owners.values()))

    def apps(self, api: DataPlaneAPI, max_input_size: int, openai: OpenAIOptions | None = None) -> dict[str, AsgiApp]:
        """Each prefix's app, built for one front-end (``openai``: the ``--openai-*`` flags, default none)."""
        if openai is None:
            from .openai_listener import OpenAIOptions
            openai = OpenAIOptions()
        return {prefix: factory(api, max_input_size, openai) if takes_openai else factory(api, max_input_size)
                for prefix, (factory, takes_openai) in self._items.items()}


def http_apps_of(plugins: Iterable[str]) -> HttpAppRegistry:
    """The HTTP apps of the named installed plugins (entry points) alone: a front-end process loads no other
    plugin. A plugin registered in code (``extra_plugins``) has no entry point, and serves no front-end process."""
    registry = HttpAppRegistry()
    wanted = list(plugins)
    if not wanted:
        return registry
    manager = pluggy.PluginManager(ENTRY_POINT_GROUP)
    manager.add_hookspecs(hookspecs)
    for name in wanted:
        manager.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
    for impl in manager.hook.tserve_register_http_apps.get_hookimpls()[::-1]:
        registry.current_plugin = impl.plugin_name
        impl.function(registry=registry)
    return registry
