"""Request and response parameters: a dict of bool, int and str values, carried as JSON."""
from __future__ import annotations

import json
from typing import Any

from .errors import TritonModelException


def checked_parameters(parameters: dict[str, Any] | str | None, owner: str,
                       value_types: tuple[type, ...] = (bool, int, str)) -> dict[str, Any]:
    """Validate ``parameters`` (a dict, a JSON object string or None) and return them as a dict.

    Keys must be str and values of ``value_types`` (response parameters: bool, int or str, as in Triton).
    """
    if parameters is None:
        return {}
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters)
        except json.JSONDecodeError as error:
            raise TritonModelException(f"{owner} parameters are not valid JSON: {error}") from None
    if not isinstance(parameters, dict):
        raise TritonModelException(f"{owner} parameters must be a dict, got {type(parameters).__name__}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"{owner} parameter keys must be str, got {type(key).__name__} ({key!r})")
        if not isinstance(value, value_types):
            allowed = ", ".join(kind.__name__ for kind in value_types)
            raise TritonModelException(f"{owner} parameter '{key}' must be one of {allowed}, "
                                       f"got {type(value).__name__}")
    return dict(parameters)
