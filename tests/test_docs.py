"""The backend guide's code runs exactly as written in docs/writing-a-backend.md."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).parents[1] / "docs" / "writing-a-backend.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)


def test_backend_guide_example_works(tmp_path: Path, tserve, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    backend_code, test_code = python_blocks()
    package = tmp_path / "src" / "my_linear"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "backend.py").write_text(backend_code)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    namespace: dict[str, object] = {}
    exec(compile(test_code, str(GUIDE), "exec"), namespace)  # the guide's own test function
    try:
        (tmp_path / "models").mkdir()
        namespace["test_linear"](tmp_path / "models", tserve)  # type: ignore[operator]
    finally:
        for name in [m for m in sys.modules if m.startswith("my_linear")]:
            del sys.modules[name]
