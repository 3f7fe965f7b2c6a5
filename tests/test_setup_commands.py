"""The README's set-up commands, CI and the scripts agree: one virtual environment, and nothing run from PATH."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Programs that a test or benchmark must take from its own interpreter's environment, never from PATH.
INTERPRETER_PROGRAMS = {"python", "python3", "pip", "pip3", "pytest", "triton-serve", "serve"}
SUBPROCESS_FUNCTIONS = {"run", "Popen", "call", "check_call", "check_output", "create_subprocess_exec",
                        "create_subprocess_shell"}


def readme_setup_commands() -> list[str]:
    """The lines of the bash blocks in README.md's "Set-up" section."""
    section = re.search(r"^## Set-up\n(.*?)^## ", (ROOT / "README.md").read_text(), flags=re.S | re.M)
    assert section, "README.md has no '## Set-up' section"
    blocks = re.findall(r"^```bash\n(.*?)^```", section.group(1), flags=re.S | re.M)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_readme_installs_into_the_venv_then_serves_and_tests_from_it() -> None:
    serve, test = readme_setup_commands()
    assert serve == "bash scripts/install.sh && .venv/bin/triton-serve"
    assert test == ".venv/bin/python -m pytest"


def test_ci_runs_the_install_script_then_the_readme_test_command() -> None:
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    _, test = readme_setup_commands()
    assert lines[-2:] == ["bash scripts/install.sh", test]


def test_install_script_makes_the_venv_the_readme_uses_and_git_ignores_it() -> None:
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert 'venv="$repo/.venv"' in script
    assert "/.venv/" in (ROOT / ".gitignore").read_text().splitlines()
    for name in ("install.sh", "check_fresh_install.sh"):
        checked = subprocess.run(["bash", "-n", str(ROOT / "scripts" / name)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr


def programs_run_from_path(source: str) -> list[tuple[int, str]]:
    """(line, program) for each command in ``source`` that starts with an interpreter program: a list literal,
    or a string given to a subprocess function."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.List) and node.elts:
            first: ast.expr = node.elts[0]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
              and node.func.attr in SUBPROCESS_FUNCTIONS and isinstance(node.func.value, ast.Name)
              and node.func.value.id in ("subprocess", "asyncio")):  # not a venv helper's own .run()
            first = node.args[0]
        else:
            continue
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            program = first.value.split(" ", 1)[0]
            if program in INTERPRETER_PROGRAMS:
                found.append((node.lineno, program))
    return found


def test_tests_and_benchmarks_run_programs_of_their_own_interpreter() -> None:
    folders = [ROOT / "tests", ROOT / "bench", *(ROOT / "plugins").glob("*/tests")]
    offenders = [f"{path.relative_to(ROOT)}:{line}: {program}" for folder in folders
                 for path in sorted(folder.rglob("*.py")) for line, program in programs_run_from_path(path.read_text())]
    assert not offenders, "use sys.executable or the scripts beside it instead:\n" + "\n".join(offenders)


def test_the_path_check_finds_a_bare_program() -> None:
    source = ('subprocess.run(["triton-serve", "plugins"])\n'
              'command = ["python3", "-c", ""]\n'
              'subprocess.run("pytest -q tests", shell=True)\n'
              'backends = ("python", "onnx")\n')
    assert sorted(programs_run_from_path(source)) == [(1, "triton-serve"), (2, "python3"), (3, "pytest")]
