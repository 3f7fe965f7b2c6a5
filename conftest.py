"""How pytest-xdist runs the suite (pyproject.toml's addopts: ``-n auto --dist loadscope``).

A run of the whole suite (``python -m pytest``, no paths) has ``WORKERS`` worker processes; a run of chosen
paths stays in one process unless ``-n`` asks for workers (``-n 4``), as does any run with ``-n 0``.

Each group of tests runs whole on one worker. A test module is a group, so its module-scoped fixtures (servers,
built wheels) start once. The plugin test folders named in ``ONE_GROUP`` are one group each: their
session-scoped fixtures are expensive (the run's one vLLM engine, Ray clusters, models exported once, storage
emulators) and must start once per run, not once per worker. The long modules in ``SPLIT`` have no module-scoped
fixtures: each of their tests is a group of its own. The groups that take longest are handed out first, so that
no worker starts one of them when the others are nearly done.
"""
from __future__ import annotations

import os
from typing import Any

import pytest

WORKERS = 4  # most tests wait on servers and processes, so even two cores keep four workers busy
ONE_GROUP = ("fil", "onnx", "openvino", "ray", "storage", "torch", "vllm")
SPLIT = ("tests/test_http_infer.py", "tests/test_grpc.py", "tests/test_shared_memory.py", "tests/test_http_errors.py",
         "plugins/analyze/tests/test_analyze.py")
# The longest groups (or the tests of a module in SPLIT), longest first (measured); the others follow, those with
# more tests first.
LONGEST_FIRST = ("tests/test_wheels.py",
                 "plugins/analyze/tests/test_analyze.py::test_triton_model_analyzer_in_remote_mode",
                 "plugins/vllm", "plugins/ray", "plugins/torch", "plugins/analyze/tests/test_analyze.py",
                 "tests/test_frontend_processes.py", "tests/test_typing.py")  # mypy: a minute when its cache is cold


def group_of(nodeid: str) -> str:
    """The group of a test, by its node id (``path/to/test_x.py::test_name[params]``, relative to the root)."""
    path = nodeid.split("::", 1)[0]
    if path in SPLIT:
        return nodeid
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "plugins" and parts[1] in ONE_GROUP:
        return f"plugins/{parts[1]}"
    return path


@pytest.hookimpl(optionalhook=True)  # pytest-xdist declares these hooks
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return WORKERS if config.args_source == pytest.Config.ArgsSource.TESTPATHS else 0


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's scheduling by scope, with ``group_of`` as the scope and the longest groups first."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            for prefix in LONGEST_FIRST:
                group = next((group for group in self.workqueue if group.startswith(prefix)), None)
                if group is not None:
                    self.workqueue.move_to_end(group, last=False)
                    break
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)
