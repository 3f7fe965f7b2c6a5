"""mypy finds no error in the core or in any plugin (settings: pyproject.toml's [tool.mypy])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TYPECHECK = Path(__file__).resolve().parents[1] / "scripts" / "typecheck.py"


def test_core_and_plugins_type_check() -> None:
    result = subprocess.run(
        [sys.executable, str(TYPECHECK)], capture_output=True, text=True, check=False, timeout=600
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, f"mypy found errors (python3 scripts/typecheck.py):\n{report}"
    assert report.startswith("Success: no issues found"), report
