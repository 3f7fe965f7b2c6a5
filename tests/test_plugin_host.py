"""Plugin discovery, ordering, blocking, validation and the missing-plugin message."""
from __future__ import annotations

import logging

import sys
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from triton_serve._engine.cli import main
from triton_serve._engine.errors import ServerError
from triton_serve._engine.hookspecs import hookimpl
from triton_serve._engine.pluginhost import PluginHost
from triton_serve.testing import ToyBackendsPlugin

from .conftest import ADD_SUB

FAKE_PLUGIN = '''
from triton_serve.plugin import hookimpl
from triton_serve.testing import TOY_BACKENDS

class FakeBackend(TOY_BACKENDS[0]):
    name = "fake_backend"

@hookimpl
def tserve_register_backends(registry):
    registry.add(FakeBackend)
'''


@pytest.fixture
def fake_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An installed distribution 'fake-plugin' 1.2.3 with an entry point named 'fake'."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "fake_tserve_plugin.py").write_text(FAKE_PLUGIN)
    info = site / "fake_plugin-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugin\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text("[triton_serve]\nfake = fake_tserve_plugin\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("TRITON_SERVE_PLUGINS", raising=False)
    monkeypatch.delenv("TRITON_SERVE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    yield "fake"
    sys.modules.pop("fake_tserve_plugin", None)


def test_builtins_register_through_the_hooks() -> None:
    host = PluginHost()
    infos = {info.name: info for info in host.describe()}
    assert infos["local_source"].hooks == ["tserve_repository_source"]
    assert infos["passthrough_scheduler"].hooks == ["tserve_register_schedulers"]
    assert infos["local_cache"].distribution == "triton-serve (built-in)"
    assert host.schedulers.owner("default") == "passthrough_scheduler"
    assert host.caches.get("local") is not None


def test_entry_point_plugin_is_discovered(fake_distribution: str) -> None:
    host = PluginHost()
    infos = {info.name: info for info in host.describe()}
    assert infos["fake"].distribution == "fake-plugin"
    assert infos["fake"].version == "1.2.3"
    assert infos["fake"].hooks == ["tserve_register_backends"]
    assert host.backends.owner("fake_backend") == "fake"


def test_autoload_can_be_disabled(fake_distribution: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_SERVE_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert PluginHost().backends.get("fake_backend") is None


def test_explicit_plugin_list(fake_distribution: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_SERVE_PLUGINS", "fake")
    assert PluginHost().backends.get("fake_backend") is not None
    monkeypatch.setenv("TRITON_SERVE_PLUGINS", "nonexistent")
    with pytest.raises(ServerError, match="TRITON_SERVE_PLUGINS names plugin 'nonexistent'"):
        PluginHost()


def test_blocked_plugin_is_not_loaded(fake_distribution: str) -> None:
    host = PluginHost(blocked=["fake"])
    assert host.backends.get("fake_backend") is None
    assert "fake" not in {info.name for info in host.describe()}


def test_misspelled_hook_fails_at_start_up() -> None:
    class Misspelled:
        @hookimpl
        def tserve_register_backend(self, registry):  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(ServerError, match="tserve_register_backend"):
        PluginHost(extra=[("misspelled", Misspelled())])


def test_duplicate_names_between_installed_plugins_fail() -> None:
    with pytest.raises(ServerError, match="'toy_identity' is registered by both plugin 'second' and plugin 'first'"):
        PluginHost(extra=[("first", ToyBackendsPlugin()), ("second", ToyBackendsPlugin())])


def test_installed_plugin_passed_again_in_code_fails_clearly(fake_distribution: str) -> None:
    import fake_tserve_plugin  # the module the entry point registers

    with pytest.raises(ServerError, match=r"extra plugin 'fake' \(<module 'fake_tserve_plugin'.* is already "
                                          r"registered: plugin 'fake' comes from the 'fake' entry point of "
                                          r"installed package fake-plugin 1.2.3\. .*needs no extra_plugins entry"):
        PluginHost(extra=[("fake", fake_tserve_plugin)])
    with pytest.raises(ServerError, match="extra plugin 'mine' .* is already registered: plugin 'fake' comes"):
        PluginHost(extra=[("mine", fake_tserve_plugin)])
    # what the error suggests: block the installed one, register yours under another name
    host = PluginHost(blocked=["fake"], extra=[("fake_from_source", fake_tserve_plugin)])
    assert host.backends.owner("fake_backend") == "fake_from_source"


def test_extra_plugin_with_a_taken_name_fails_clearly(fake_distribution: str) -> None:
    with pytest.raises(ServerError, match="extra plugin 'fake' .* has a name already taken: plugin 'fake' comes from "
                                          "the 'fake' entry point of installed package fake-plugin 1.2.3"):
        PluginHost(extra=[("fake", ToyBackendsPlugin())])
    with pytest.raises(ServerError, match="plugin 'local_cache' comes from the built-in plugins"):
        PluginHost(extra=[("local_cache", ToyBackendsPlugin())])
    with pytest.raises(ServerError, match="plugin 'toys' comes from an earlier extra_plugins entry"):
        PluginHost(extra=[("toys", ToyBackendsPlugin()), ("toys", ToyBackendsPlugin())])


def test_installed_plugin_overrides_a_builtin_name() -> None:
    class MyCache:
        pass

    class OverridingPlugin:
        @hookimpl
        def tserve_register_caches(self, registry):  # type: ignore[no-untyped-def]
            registry.add("local", MyCache)

    host = PluginHost(extra=[("mine", OverridingPlugin())])
    assert host.caches.get("local") is MyCache
    assert host.caches.owner("local") == "mine"


def test_repository_source_hook_picks_the_first_taker(tmp_path: Path) -> None:
    class MemorySource:
        @hookimpl
        def tserve_repository_source(self, location):  # type: ignore[no-untyped-def]
            return "memory-source" if location.startswith("mem://") else None

    host = PluginHost(extra=[("mem", MemorySource())])
    assert host.repository_source("mem://models") == "memory-source"
    assert type(host.repository_source(str(tmp_path))).__name__ == "LocalRepositorySource"
    with pytest.raises(ServerError, match="no repository-source plugin understands model repository 'nosuch://b'"):
        PluginHost().repository_source("nosuch://b")


def test_model_without_backend_plugin_names_the_package(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("onnx_model", 'platform: "onnxruntime_onnx"\nmax_batch_size: 0')
    add_model("add_sub", ADD_SUB)
    server = toy_server(blocked_plugins=["onnxruntime"])  # as if triton-serve-onnx were not installed
    client = httpclient.InferenceServerClient(server.http_url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["onnx_model"]["state"] == "UNAVAILABLE"
    assert "pip install triton-serve-onnx" in index["onnx_model"]["reason"]
    assert client.is_model_ready("add_sub")
    assert not client.is_server_ready()  # strict readiness: a failed model makes the server not ready


def test_blocking_the_default_scheduler_fails_loads_clearly(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    server = toy_server(blocked_plugins=["passthrough_scheduler"])
    index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    assert "no installed plugin provides the 'default' scheduler" in index[0]["reason"]


def test_missing_scheduler_plugin_names_the_package(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("batched", ADD_SUB + "dynamic_batching { }")
    server = toy_server(blocked_plugins=["batching"])  # as if triton-serve-batching were not installed
    index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    assert "'dynamic_batching' scheduler" in index[0]["reason"]
    assert "pip install triton-serve-batching" in index[0]["reason"]


def test_plugins_command_lists_plugins(fake_distribution: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "fake  (fake-plugin 1.2.3)" in out
    assert "hooks: tserve_register_backends" in out
    assert "local_source  (triton-serve (built-in)" in out
    assert "backend fake_backend: available (from plugin 'fake')" in out
    assert main(["plugins", "--plugin", "no:fake"]) == 0
    assert "fake-plugin" not in capsys.readouterr().out


def _install(site: Path, dist: str, version: str, entry_points: str = "", modules: dict[str, str] | None = None,
             summary: str = "") -> None:
    for module, text in (modules or {}).items():
        (site / f"{module}.py").write_text(text)
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\nSummary: {summary}\n")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points)


def test_a_plugin_whose_module_fails_to_import_is_left_out_and_listed(
        fake_distribution: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site"  # beside the working 'fake' plugin
    _install(site, "broken-plugin", "0.3", "[triton_serve]\nbroken = broken_tserve_plugin\n",
             {"broken_tserve_plugin": "import a_module_that_is_not_installed\n"})
    _install(site, "triton-serve-deployer", "0.2", summary="Deploys models somewhere else")
    with caplog.at_level(logging.ERROR, logger="triton_serve"):
        host = PluginHost()
    assert host.backends.owner("fake_backend") == "fake"  # the other plugins serve
    assert host.broken == {"broken": "ModuleNotFoundError: No module named 'a_module_that_is_not_installed'"}
    assert ["plugin 'broken' is left out: its module failed to import (ModuleNotFoundError: No module named "
            "'a_module_that_is_not_installed')"] == [record.getMessage() for record in caplog.records]
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert ("broken  (broken-plugin 0.3)\n    failed to import: ModuleNotFoundError: No module named "
            "'a_module_that_is_not_installed'\n") in out
    assert "deployer  (triton-serve-deployer 0.2)\n    no hooks: Deploys models somewhere else\n" in out
    sys.modules.pop("broken_tserve_plugin", None)


def test_hookspec_module_documents_every_hook() -> None:
    from triton_serve._engine import hookspecs

    hooks = [name for name in dir(hookspecs) if name.startswith("tserve_")]
    assert len(hooks) == 7
    docs = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    tests = "".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    for name in hooks:
        assert getattr(hookspecs, name).__doc__, f"hook {name} has no docstring"
        assert f"def {name}(" in docs, f"hook {name} is not documented with its signature in docs/plugins.md"
        assert name in tests, f"hook {name} is not exercised by any core test"


COMMAND_PLUGIN = '''
from triton_serve.plugin import hookimpl

def hello(argv):
    print("hello", *argv)
    return 7

@hookimpl
def tserve_register_commands(registry):
    registry.add("hello", hello, "say hello")
'''


def test_plugins_add_subcommands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """tserve_register_commands: ``triton-serve hello a b`` runs the plugin's function with ``[a, b]``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "hello_tserve_plugin.py").write_text(COMMAND_PLUGIN)
    info = site / "hello_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hello-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[triton_serve]\nhello = hello_tserve_plugin\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("TRITON_SERVE_PLUGINS", "hello")
    try:
        assert main(["hello", "a", "b"]) == 7
        assert capsys.readouterr().out == "hello a b\n"
        assert main(["plugins"]) == 0
        assert "command triton-serve hello: say hello (from plugin 'hello')" in capsys.readouterr().out
        assert main(["goodbye"]) == 1
        assert "unknown command 'goodbye' (commands: plugins, hello;" in capsys.readouterr().err
    finally:
        sys.modules.pop("hello_tserve_plugin", None)


def test_command_names_are_checked() -> None:
    from triton_serve.plugin import CommandRegistry

    registry = CommandRegistry()
    with pytest.raises(ServerError, match="command 'plugins' is built into triton-serve"):
        registry.add("plugins", lambda argv: 0)
    with pytest.raises(ValueError, match="one word"):
        registry.add("--analyze", lambda argv: 0)
    registry.current_plugin = "first"
    registry.add("analyze", lambda argv: 0)
    registry.current_plugin = "second"
    with pytest.raises(ServerError, match="registered by both plugin 'first' and plugin 'second'"):
        registry.add("analyze", lambda argv: 0)
