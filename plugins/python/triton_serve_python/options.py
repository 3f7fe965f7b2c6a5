"""The python backend's options (``--backend-config=python,<key>=<value>``, or a model parameter of that key)
and its model parameters, declared for the core's parser."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from triton_serve.plugin import option

_MIB = 1 << 20


def _refuse(broken: Callable[[float], bool], message: str) -> Callable[[float], None]:
    """A check that raises ValueError(message), Triton's python backend's words, when ``broken(value)``."""
    def check(value: float) -> None:
        if broken(value):
            raise ValueError(message)
    return check


def _not_empty(value: str) -> None:
    if not value:
        raise ValueError("shm-region-prefix-name must at least contain one character.")


@dataclass(frozen=True)
class PythonBackendOptions:
    """Triton's option names where Triton has the option; ``execute-timeout-seconds``,
    ``restart-on-failure`` and ``busy-poll-microseconds`` are ours."""

    shm_default_byte_size: int = option(
        _MIB, check=_refuse(lambda size: size < _MIB, "shm-default-byte-size can't be smaller than 4 MiBs"),
        doc="each shared-memory arena's starting size (one per direction per worker)")
    shm_growth_byte_size: int = option(
        _MIB, check=_refuse(lambda size: size <= 0, "shm-growth-byte-size can't be smaller than or equal to zero."),
        doc="an arena too small for a batch is replaced by one larger by a multiple of this")
    shm_region_prefix_name: str = option("tserve_python_", check=_not_empty,
                                         doc="shared-memory names: <prefix><server pid>_<n> in /dev/shm")
    stub_timeout_seconds: float = option(
        30.0, check=_refuse(lambda seconds: seconds <= 0,
                            "stub-timeout-seconds can't be smaller than or equal to zero."),
        doc="how long a worker may take to start, initialize or finalize")
    execute_timeout_seconds: float = option(0.0, minimum=0,
                                            doc="a batch running longer gets its worker killed; 0: no limit")
    restart_on_failure: bool = option(True, doc="start a new worker when one dies or is killed")
    busy_poll_microseconds: int = option(
        2000, minimum=0, doc="a batch sent while no other is on its way: the most the server polls for its answer, "
                             "and the worker for the next batch, before sleeping (each four times its usual wait, "
                             "0 where that is longer); 0: always sleep")


@dataclass(frozen=True)
class PythonModelParameters(PythonBackendOptions):
    """A model's parameters: any backend option, for this model only (the server-wide value is the default),
    and ``stack_requests`` (stacking.py)."""

    stack_requests: bool = option(False, key="stack_requests",
                                  doc="a batch reaches model.py as one request with stacked inputs")
