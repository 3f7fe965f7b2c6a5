"""The public API is ``triton_serve.plugin`` (``triton_serve.frontend`` for plugin apps on the HTTP port,
``triton_serve.worker`` for code in a model's worker process, ``triton_serve.testing`` for tests): plugins use
nothing else, and every public name says what it is."""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import Message

import triton_serve.frontend
import triton_serve.inprocess
import triton_serve.plugin
import triton_serve.testing
import triton_serve.worker

ROOT = Path(__file__).resolve().parent.parent
PUBLIC_MODULES = {"triton_serve", "triton_serve.plugin", "triton_serve.frontend", "triton_serve.testing",
                  "triton_serve.inprocess", "triton_serve.worker"}


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module == "triton_serve":
                found += [(node.lineno, f"triton_serve.{alias.name}") for alias in node.names]
    return found


def test_plugins_import_only_the_public_modules_of_the_core() -> None:
    offenders = []
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        if "egg-info" in str(path) or "/build/" in str(path):
            continue
        for line, module in _imported_modules(path):
            if (module == "triton_serve" or module.startswith("triton_serve.")) and module not in PUBLIC_MODULES:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
        if re.search(r"triton_serve\._(?!_)", path.read_text()):  # monkeypatch targets and the like
            offenders.append(f"{path.relative_to(ROOT)} names a private module of triton_serve")
    assert not offenders, "\n".join(offenders)


def test_the_check_finds_a_private_import(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text("from triton_serve._engine.batch import concat_inputs\nimport triton_serve._engine.server\n")
    assert [name for _, name in _imported_modules(module)] == ["triton_serve._engine.batch",
                                                                 "triton_serve._engine.server"]


def _public_objects() -> list[tuple[str, Any]]:
    objects = []
    for module in (triton_serve.plugin, triton_serve.frontend, triton_serve.testing, triton_serve.inprocess,
                   triton_serve.worker):
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue  # constants are documented where they are listed
            if inspect.isclass(obj) and issubclass(obj, Message):
                continue  # Triton's model_config.proto messages: documented by model_config.proto
            objects.append((f"{module.__name__}.{name}", obj))
            if inspect.isclass(obj):
                for attribute, value in vars(obj).items():
                    function = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                    if not attribute.startswith("_") and inspect.isfunction(function):
                        objects.append((f"{module.__name__}.{name}.{attribute}", getattr(obj, attribute)))
    return objects


def test_every_public_name_has_a_docstring() -> None:
    undocumented = [name for name, obj in _public_objects() if not inspect.getdoc(obj)]
    assert not undocumented, f"public names without a docstring: {', '.join(undocumented)}"


@pytest.mark.parametrize("module", [triton_serve.plugin, triton_serve.testing, triton_serve.inprocess,
                                    triton_serve.worker])
def test_all_lists_only_names_the_module_has(module: Any) -> None:
    assert [name for name in module.__all__ if not hasattr(module, name)] == []
    assert len(set(module.__all__)) == len(module.__all__)


def test_the_package_ships_type_information() -> None:
    assert (Path(triton_serve.__file__).parent / "py.typed").is_file()
