"""pb_utils.ModelConfig for ``auto_complete_config``, and look-ups in a model config dict."""
from __future__ import annotations

import json
from typing import Any

from .dtypes import BY_CONFIG_NAME

_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")


class ModelConfig:
    """The model's configuration as ``auto_complete_config`` sees it: a dict in Triton's JSON shape that
    the ``set_*``/``add_*`` methods fill in, raising ValueError where the model and the config disagree."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        self._config: dict[str, Any] = json.loads(model_config) if isinstance(model_config, str) else model_config
        for key in ("input", "output"):
            self._config.setdefault(key, [])
        self._config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        return self._config

    @property
    def _model(self) -> str:
        return f"model '{self._config.get('name', '')}'"

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 0:
            raise ValueError(f"set_max_batch_size for {self._model} needs a non-negative int, got {max_batch_size!r}")
        configured = self._config["max_batch_size"]
        if configured not in (0, max_batch_size):
            raise ValueError(f"configuration specified max_batch_size {configured}, but auto_complete_config of "
                             f"{self._model} sets max_batch_size {max_batch_size}")
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        if "sequence_batching" in self._config:
            raise ValueError(f"configuration of {self._model} uses sequence_batching, but auto_complete_config "
                             "asks for dynamic_batching")
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        if not isinstance(transaction_policy_dict, dict) or set(transaction_policy_dict) - {"decoupled"}:
            raise ValueError(f"set_model_transaction_policy for {self._model} takes a dict with only the key "
                             f"'decoupled', got {transaction_policy_dict!r}")
        decoupled = transaction_policy_dict.get("decoupled", False)
        if not isinstance(decoupled, bool):
            raise ValueError(f"'decoupled' in set_model_transaction_policy for {self._model} must be a bool")
        configured = self._config.get("model_transaction_policy", {}).get("decoupled")
        if configured is not None and configured != decoupled:
            raise ValueError(f"configuration of {self._model} specified decoupled {configured}, but "
                             f"auto_complete_config sets decoupled {decoupled}")
        self._config["model_transaction_policy"] = {"decoupled": decoupled}

    def add_input(self, input: dict[str, Any]) -> None:
        self._add_tensor("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output, _OUTPUT_KEYS)

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        self._check_tensor(kind, tensor, allowed)
        name = tensor["name"]
        for existing in self._config[kind]:
            if existing.get("name") != name:
                continue
            configured_type = existing.get("data_type", "TYPE_INVALID")
            if configured_type not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(f"unable to load {self._model}: its configuration gives {kind} '{name}' data_type "
                                 f"{configured_type}, but auto_complete_config gives {tensor['data_type']}")
            configured_dims = [int(d) for d in existing.get("dims", [])]
            if configured_dims and configured_dims != list(tensor["dims"]):
                raise ValueError(f"unable to load {self._model}: its configuration gives {kind} '{name}' dims "
                                 f"{configured_dims}, but auto_complete_config gives {list(tensor['dims'])}")
            if "optional" in tensor and existing.get("optional", False) != tensor["optional"]:
                raise ValueError(f"unable to load {self._model}: its configuration gives {kind} '{name}' "
                                 f"optional {existing.get('optional', False)}, but auto_complete_config gives "
                                 f"{tensor['optional']}")
            existing.update(tensor)
            return
        self._config[kind].append(dict(tensor))

    def _check_tensor(self, kind: str, tensor: Any, allowed: tuple[str, ...]) -> None:
        where = f"add_{kind} for {self._model}"
        if not isinstance(tensor, dict):
            raise ValueError(f"{where} takes a dict, got {type(tensor).__name__}")
        unknown = sorted(set(tensor) - set(allowed))
        if unknown:
            raise ValueError(f"{where}: {kind} '{tensor.get('name', '?')}' has unknown properties {unknown}; "
                             f"allowed are {', '.join(allowed)}")
        missing = [key for key in ("name", "data_type", "dims") if key not in tensor]
        if missing:
            raise ValueError(f"{where}: {kind} '{tensor.get('name', '?')}' is missing {', '.join(missing)}")
        if tensor["data_type"] not in BY_CONFIG_NAME:
            raise ValueError(f"{where}: {kind} '{tensor['name']}' has data_type {tensor['data_type']!r}; expected "
                             f"one of {', '.join(BY_CONFIG_NAME)}")
        dims = tensor["dims"]
        if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                           for d in dims):
            raise ValueError(f"{where}: {kind} '{tensor['name']}' dims must be a list of ints, got {dims!r}")


def _tensor_config(model_config: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    for tensor in model_config.get(kind, []):
        if tensor.get("name") == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry of input ``name`` in a parsed model config, or None."""
    return _tensor_config(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry of output ``name`` in a parsed model config, or None."""
    return _tensor_config(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))
