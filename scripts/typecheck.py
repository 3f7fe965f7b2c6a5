"""Run mypy over the core and every plugin with the settings in pyproject.toml's [tool.mypy].

    python3 scripts/typecheck.py                    # the core and every package of plugins/*/pyproject.toml
    python3 scripts/typecheck.py plugins/onnx/triton_serve_onnx/instance.py core/_engine/batch.py
    python3 scripts/typecheck.py --warn-return-any  # any other mypy option, over everything

The core lives in core/ but imports as ``triton_serve``, and the editable installs are import
hooks that mypy cannot follow, so this script gives mypy a search path of its own: a link
``build/mypy-path/triton_serve -> core`` plus every ``plugins/<name>/`` folder. File arguments
under core/ are mapped onto that link, and mypy's report names core/ again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK_DIR = REPO / "build" / "mypy-path"
CORE_LINK = LINK_DIR / "triton_serve"
CORE_PREFIX = "core/"
LINK_PREFIX = f"{CORE_LINK.relative_to(REPO)}/"


def ensure_core_link() -> None:
    """Create ``build/mypy-path/triton_serve`` pointing at core/ (idempotent)."""
    if CORE_LINK.is_symlink() and CORE_LINK.resolve() == REPO / "core":
        return
    LINK_DIR.mkdir(parents=True, exist_ok=True)
    if CORE_LINK.is_symlink():
        CORE_LINK.unlink()
    CORE_LINK.symlink_to(Path("..", "..", "core"), target_is_directory=True)


def search_path() -> str:
    """MYPYPATH: the core link's folder, then each plugin folder, in a stable order."""
    plugins = sorted(str(p.parent) for p in (REPO / "plugins").glob("*/pyproject.toml"))
    return os.pathsep.join([str(LINK_DIR), *plugins])


def default_targets() -> list[str]:
    """mypy's ``-p``/``-m`` arguments for the core and each plugin's top-level packages and modules."""
    targets = ["-p", "triton_serve"]
    for project in sorted((REPO / "plugins").glob("*/pyproject.toml")):
        setuptools = tomllib.loads(project.read_text())["tool"]["setuptools"]
        for package in setuptools.get("packages", []):
            if "." not in package:
                targets += ["-p", package]
        for module in setuptools.get("py-modules", []):
            targets += ["-m", module]
    return targets


def names_targets(args: list[str]) -> bool:
    """Whether ``args`` name what to check (``-p``, ``-m``, a .py file, a folder under core/ or plugins/)."""
    return any(arg in ("-p", "--package", "-m", "--module") or _is_source(arg) for arg in args)


def _is_source(arg: str) -> bool:
    path = Path(arg).resolve()
    if path.is_file():
        return path.suffix in (".py", ".pyi")
    return path.is_dir() and (path.is_relative_to(REPO / "core") or path.is_relative_to(REPO / "plugins"))


def to_link_path(arg: str) -> str:
    """Map a path under core/ onto the link, so mypy names its module ``triton_serve...``."""
    path = Path(arg).resolve()
    if path.is_relative_to(REPO / "core"):
        return str(CORE_LINK / path.relative_to(REPO / "core"))
    return arg


def run_mypy(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run mypy from the repository root and return its result, paths reported under core/."""
    ensure_core_link()
    env = {**os.environ, "MYPYPATH": search_path()}
    result = subprocess.run(
        [sys.executable, "-m", "mypy", *map(to_link_path, args), *([] if names_targets(args) else default_targets())],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )
    result.stdout = result.stdout.replace(LINK_PREFIX, CORE_PREFIX)
    return result


def main(argv: list[str] | None = None) -> int:
    """Type-check, print mypy's report, and return its exit status."""
    result = run_mypy(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
