"""Bound functions: what ``Triton.bind`` registers and the ``pytriton`` backend serves."""
from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .model_config import TritonModelConfig

# The file in a bound model's version folder that names its binding (the model's only file).
BINDING_FILE = "binding.pytriton"


@dataclasses.dataclass
class Binding:
    """One bound model: its config, one function per instance, how results are checked (``strict``),
    whether each instance runs in a worker process (``isolated``: then ``pickled`` holds each
    function's pickle) and what to do when a function raises PyTritonUnrecoverableError."""

    config: TritonModelConfig
    functions: Sequence[Callable[..., Any]]
    strict: bool = False
    isolated: bool = False
    pickled: Sequence[bytes] = ()
    on_unrecoverable: Callable[[BaseException], None] | None = None
    key: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)


_BINDINGS: dict[str, Binding] = {}
_LOCK = threading.Lock()


def register(binding: Binding) -> str:
    """Make ``binding`` findable by its key (what the model's binding file holds)."""
    with _LOCK:
        _BINDINGS[binding.key] = binding
    return binding.key


def unregister(binding: Binding) -> None:
    """Forget ``binding`` (its model, if still loaded, keeps the binding it found at load)."""
    with _LOCK:
        _BINDINGS.pop(binding.key, None)


def find(key: str) -> Binding | None:
    """The binding registered under ``key``, or None."""
    with _LOCK:
        return _BINDINGS.get(key)
