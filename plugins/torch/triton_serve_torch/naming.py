"""Triton's PyTorch naming conventions: which forward argument each config input feeds, and which
element of forward's result each config output reads.

Inputs, tried in order: every name is a forward argument name; every name is ``<name>__<index>``
(the index is the argument's position); otherwise the config's order is forward's order.
Outputs: every name is one the model file gives its results (an AOTInductor package's ``RESULT[...]``); every
name is ``<name>__<index>`` (the index into the returned tuple); otherwise config order.
The config-order fallback logs a warning, as Triton does.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from triton_serve.plugin import ServerError

log = logging.getLogger(__name__)


def named_index(name: str) -> int | None:
    """The index of a ``<name>__<index>`` tensor name (split at the first ``__``), or None."""
    _, separator, index = name.partition("__")
    return int(index) if separator and index.isascii() and index.isdigit() else None


def bind_inputs(model: str, inputs: Sequence[str], arguments: Sequence[str]) -> dict[str, int]:
    """Config input name -> position in forward's arguments."""
    if all(name in arguments for name in inputs):
        return {name: arguments.index(name) for name in inputs}
    positions = _by_named_index(model, "input", inputs, len(arguments), "forward takes")
    if positions is not None:
        return positions
    log.warning("pytorch model '%s': inputs %s are neither all forward argument names %s nor all "
                "<name>__<index>; binding them to forward's arguments in config order",
                model, list(inputs), list(arguments))
    if len(inputs) > len(arguments):
        raise ServerError(f"pytorch model '{model}': the config lists {len(inputs)} inputs {list(inputs)}, but "
                          f"forward takes {len(arguments)} {list(arguments)}; name the inputs after forward's "
                          "arguments or as <name>__<index>")
    return {name: position for position, name in enumerate(inputs)}


def bind_outputs(model: str, outputs: Sequence[str], count: int | None,
                 names: Sequence[str] = ()) -> dict[str, int]:
    """Config output name -> index in forward's flattened result (``count`` outputs, None if not known
    before the model runs; ``names``: the results' own names, where the model file gives them)."""
    if names and outputs and all(name in names for name in outputs):
        return {name: list(names).index(name) for name in outputs}
    positions = _by_named_index(model, "output", outputs, count, "forward returns")
    if positions is not None:
        return positions
    log.warning("pytorch model '%s': outputs %s do not all follow <name>__<index>; reading forward's results "
                "in config order", model, list(outputs))
    if count is not None and len(outputs) > count:
        raise ServerError(f"pytorch model '{model}': the config lists {len(outputs)} outputs {list(outputs)}, "
                          f"but forward returns {count}")
    return {name: position for position, name in enumerate(outputs)}


def _by_named_index(model: str, kind: str, names: Sequence[str], count: int | None,
                    what_count: str) -> dict[str, int] | None:
    indices = {name: named_index(name) for name in names}
    if not names or any(index is None for index in indices.values()):
        return None
    positions = {name: index for name, index in indices.items() if index is not None}
    by_position: dict[int, str] = {}
    for name, index in positions.items():
        if index in by_position:
            raise ServerError(f"pytorch model '{model}': {kind}s '{by_position[index]}' and '{name}' "
                              f"both name index {index}")
        if count is not None and index >= count:
            raise ServerError(f"pytorch model '{model}': {kind} '{name}' names index {index}, but "
                              f"{what_count} {count}")
        by_position[index] = name
    return positions
