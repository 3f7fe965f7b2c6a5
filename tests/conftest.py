"""Shared fixtures for the core tests: writing small model repositories."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

ADD_SUB = """
backend: "toy_add_sub"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""

# Decoupled: INPUT0 = n gives n responses 0..n-1, then the final flag (triton_serve.testing's toy_repeat).
REPEAT = """
backend: "toy_repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }
output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }
"""


def write_model(root: Path, name: str, config: str | None, versions: Iterable[str | int] = (1,),
                files: dict[str, str] | None = None) -> Path:
    """Create ``root/name`` with an optional config.pbtxt, version folders and extra files."""
    model_dir = root / name
    model_dir.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    for version in versions:
        (model_dir / str(version)).mkdir(exist_ok=True)
    for relative, text in (files or {}).items():
        path = model_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return model_dir


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    return root


@pytest.fixture
def add_model(repo: Path) -> Callable[..., Path]:
    def add(name: str, config: str | None, versions: Iterable[str | int] = (1,),
            files: dict[str, str] | None = None) -> Path:
        return write_model(repo, name, config, versions, files)
    return add


@pytest.fixture
def frontend_processes() -> int:
    """How many front-end processes ``toy_server`` starts (0: front-ends in the test process). A test
    module that must behave the same either way overrides this with ``params=FRONTEND_MODES``."""
    return 0


FRONTEND_MODES = [0, 2]  # in-process front-ends, and two front-end processes forwarding to the owner


@pytest.fixture
def http_server() -> str:
    """The HTTP server ``toy_server`` runs; test_http_infer runs under both."""
    return "uvicorn"


@pytest.fixture
def toy_server(tserve, toy_plugin, repo, frontend_processes, http_server):  # type: ignore[no-untyped-def]
    """Start a server on ``repo`` with the toy backends; call it after adding models."""
    def start(**options):  # type: ignore[no-untyped-def]
        options.setdefault("frontend_processes", frontend_processes)
        options.setdefault("http_server", http_server)
        return tserve(repo, extra_plugins=[("toy", toy_plugin)], **options)
    return start


DATATYPES = {
    "BOOL": np.array([True, False, True]),
    "INT8": np.array([-128, 0, 127], dtype=np.int8),
    "INT16": np.array([-32768, 1, 32767], dtype=np.int16),
    "INT32": np.array([-2**31, 2, 2**31 - 1], dtype=np.int32),
    "INT64": np.array([-2**63, 3, 2**63 - 1], dtype=np.int64),
    "UINT8": np.array([0, 1, 255], dtype=np.uint8),
    "UINT16": np.array([0, 2, 65535], dtype=np.uint16),
    "UINT32": np.array([0, 3, 2**32 - 1], dtype=np.uint32),
    "UINT64": np.array([0, 4, 2**64 - 1], dtype=np.uint64),
    "FP16": np.array([-1.5, 0.25, 65504], dtype=np.float16),
    "FP32": np.array([-1.5, 3.25e-8, 3.4e38], dtype=np.float32),
    "FP64": np.array([-1.5, 1e-300, 1.7e308], dtype=np.float64),
    "BF16": np.array([1.0, -2.5, 256.0], dtype=ml_dtypes.bfloat16),
    "BYTES": np.array([b"hello", b"", "ünï".encode()], dtype=np.object_),
}
CONFIG_TYPE = {"BYTES": "TYPE_STRING"}


def every_datatype_config() -> str:
    lines = ['backend: "toy_identity"', "max_batch_size: 0"]
    for name in DATATYPES:
        config_type = CONFIG_TYPE.get(name, f"TYPE_{name}")
        lines.append(f'input {{ name: "INPUT_{name}" data_type: {config_type} dims: [ -1 ] optional: true }}')
        lines.append(f'output {{ name: "OUTPUT_{name}" data_type: {config_type} dims: [ -1 ] }}')
    return "\n".join(lines)
