"""docs/writing-a-backend.md works as written: its files, commands, shown output and tests; its links resolve."""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from triton_serve._engine.cli import build_parser, main, options_from_args
from triton_serve.testing import RunningServer, free_port

DOCS = Path(__file__).parents[1] / "docs"
GUIDE = DOCS / "writing-a-backend.md"
# ```lang title="path"  ...  ```: a file of the walkthrough; ```lang  ...  ```: anything else
BLOCK = re.compile(r'^```(\w*)(?: title="([^"]+)")?\n(.*?)^```$', re.S | re.M)


def blocks(language: str, *, titled: bool = False) -> list[tuple[str, str]]:
    """(title, text) of the guide's code blocks in ``language``: only titled ones (files), or only untitled."""
    return [(title, text) for lang, title, text in BLOCK.findall(GUIDE.read_text())
            if lang == language and bool(title) == titled]


def guide_files() -> dict[str, str]:
    return {title: text for lang, title, text in BLOCK.findall(GUIDE.read_text()) if title}


def shell_lines() -> list[str]:
    return [line for _, text in blocks("bash") for line in text.splitlines() if line.strip()]


def shown_output(starting_with: str) -> str:
    """The text block of the guide that starts with ``starting_with`` (what a command prints)."""
    found = [text for _, text in blocks("text") if text.startswith(starting_with)]
    assert len(found) == 1, f"the guide shows no single output block starting with {starting_with!r}"
    return found[0]


def run_as_the_guide_says(line: str, cwd: Path) -> None:
    """One shell line of the guide; a leading ``python`` is this interpreter."""
    if line.startswith("python "):
        line = shlex.join([sys.executable]) + line.removeprefix("python")
    subprocess.run(["bash", "-ec", line], cwd=cwd, check=True, timeout=60)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The walkthrough's folder made by its own commands and files, then "installed" as ``pip install -e .``
    would: ``src`` on sys.path and a dist-info holding the pyproject's name, version and entry points
    (what the server's plugin discovery reads). Autoload is limited to the guide's plugin."""
    [setup] = [text for _, text in blocks("bash") if "mkdir -p linear-backend" in text]
    subprocess.run(["bash", "-ec", setup], cwd=tmp_path, check=True, timeout=60)
    folder = tmp_path / "linear-backend"
    for path, text in guide_files().items():
        (folder / path).write_text(text)
    [make_weights] = [line for line in shell_lines() if "np.save" in line]
    run_as_the_guide_says(make_weights, folder)
    metadata = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    info = folder / "src" / f"{metadata['name'].replace('-', '_')}-{metadata['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {metadata['name']}\nVersion: {metadata['version']}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
        for group, points in metadata["entry-points"].items()))
    monkeypatch.syspath_prepend(str(folder / "src"))
    monkeypatch.setenv("TRITON_SERVE_PLUGINS", "linear")
    monkeypatch.delenv("TRITON_SERVE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    yield folder
    for name in [m for m in sys.modules if m.startswith("linear_backend")]:
        del sys.modules[name]


def test_walkthrough_files_are_the_ones_its_layout_lists() -> None:
    files = set(guide_files())
    assert {"pyproject.toml", "src/linear_backend/backend.py", "tests/test_linear.py",
            "models/linear_demo/config.pbtxt", "client.py"} <= files
    assert 'dependencies = ["triton-serve>=0.1,<0.2"' in guide_files()["pyproject.toml"]


def test_walkthrough_imports_only_the_public_api() -> None:
    imported = re.findall(r"^\s*(?:from|import) (triton_serve\S*)", "\n".join(guide_files().values()), re.M)
    assert imported and set(imported) <= {"triton_serve.plugin", "triton_serve.testing"}


def test_plugins_command_shows_what_the_guide_shows(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "triton-serve plugins" in shell_lines()
    assert main(["plugins"]) == 0
    printed = capsys.readouterr().out
    assert shown_output("linear  (") in printed
    assert shown_output("backend linear:") in printed


def test_served_model_answers_the_guide_client(project: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    [serve] = [line for line in shell_lines() if line.startswith("triton-serve --model-repository")]
    monkeypatch.chdir(project)
    options = options_from_args(build_parser().parse_args(shlex.split(serve)[1:]))
    options = dataclasses.replace(options, frontend_processes=0, http_port=free_port(), grpc_port=free_port(),
                                  metrics_port=free_port(), http_address="127.0.0.1", grpc_address="127.0.0.1",
                                  metrics_address="127.0.0.1")
    server = RunningServer(options)
    try:
        client = guide_files()["client.py"]
        assert '"localhost:8000"' in client
        exec(compile(client.replace('"localhost:8000"', repr(server.http_url)), "client.py", "exec"), {})
    finally:
        server.stop()
    assert capsys.readouterr().out == shown_output("[[")


def test_walkthrough_tests_pass(project: Path) -> None:
    assert "python -m pytest tests -q" in shell_lines()
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    result = subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"], cwd=project,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert shown_output("3 passed").strip() in result.stdout


def test_reference_snippets_compile() -> None:
    snippets = [text for _, text in blocks("python")]
    assert len(snippets) >= 2
    for text in snippets:  # fragments of an ``execute``: compiled as the body of a coroutine
        compile("async def snippet(self, requests):\n" + textwrap.indent(text, "    "), str(GUIDE), "exec")


@pytest.mark.parametrize("page", ["writing-a-backend.md", "threading.md"])
def test_links_resolve(page: str) -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", (DOCS / page).read_text()):
        if target.startswith("http"):
            continue
        path, _, anchor = target.partition("#")
        linked = DOCS / (path or page)
        assert linked.is_file(), f"{page} links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
            assert anchor in slugs, f"{page} links to {target}: no such heading"


def test_threading_page_is_linked_from_readme_and_guide() -> None:
    assert "](docs/threading.md)" in (DOCS.parent / "README.md").read_text()
    assert "](threading.md)" in GUIDE.read_text()
