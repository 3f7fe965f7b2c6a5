"""The python backend's options: ``--backend-config=python,<key>=<value>`` or a model parameter of that key."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from triton_serve.plugin import ModelConfig, ServerError

_MIB = 1 << 20
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class PythonBackendOptions:
    """Triton's option names where Triton has the option; ``execute-timeout-seconds`` and
    ``restart-on-failure`` are ours."""

    shm_default_byte_size: int = _MIB  # each arena's starting size (one per direction per worker)
    shm_growth_byte_size: int = _MIB  # an arena too small for a batch grows in steps of this
    shm_region_prefix_name: str = "tserve_python_"  # shared-memory names start with this
    stub_timeout_seconds: float = 30.0  # how long a worker may take to start, initialize or finalize
    execute_timeout_seconds: float = 0.0  # a batch running longer gets its worker killed; 0 means no limit
    restart_on_failure: bool = True  # start a new worker when one dies or is killed

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> PythonBackendOptions:
        """From ``--backend-config=python,...`` options; other keys (Triton passes global ones) are ignored."""
        return cls()._updated(options, "--backend-config=python")

    def for_model(self, config: ModelConfig) -> PythonBackendOptions:
        """These options with the model's ``parameters`` entries of the same names applied."""
        params = {key: value.string_value for key, value in config.parameters.items()}
        return self._updated(params, f"parameters of model '{config.name}'")

    def _updated(self, options: Mapping[str, str], where: str) -> PythonBackendOptions:
        changes: dict[str, object] = {}
        for option in dataclasses.fields(self):
            key = option.name.replace("_", "-")
            if key in options:
                changes[option.name] = _convert(options[key], option.type, key, where)
        updated = dataclasses.replace(self, **changes)
        # Triton's python backend's checks, with its words
        problems = [(updated.shm_growth_byte_size <= 0, "shm-growth-byte-size can't be smaller than or equal to zero."),
                    (updated.shm_default_byte_size < _MIB, "shm-default-byte-size can't be smaller than 4 MiBs"),
                    (not updated.shm_region_prefix_name, "shm-region-prefix-name must at least contain one character."),
                    (updated.stub_timeout_seconds <= 0, "stub-timeout-seconds can't be smaller than or equal to zero."),
                    (updated.execute_timeout_seconds < 0, "execute-timeout-seconds can't be negative (0: no limit).")]
        for broken, message in problems:
            if broken:
                raise ServerError(f"{where}: {message}")
        return updated


def _convert(text: str, kind: object, key: str, where: str) -> object:
    value = text.strip()
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
    except ValueError:
        raise ServerError(f"{where}: '{key}' must be a number, got '{text}'") from None
    if kind == "bool":
        return parse_flag(text, key, where)
    return text


def parse_flag(text: str, key: str, where: str) -> bool:
    """``true``/``false`` (or 1/0, yes/no, on/off) as a bool; anything else is a ServerError naming ``key``."""
    value = text.strip().lower()
    if value in _TRUE + _FALSE:
        return value in _TRUE
    raise ServerError(f"{where}: '{key}' must be true or false, got '{text}'")
