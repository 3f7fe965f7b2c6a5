"""The deployment's statistics: each replica's Triton ``model_stats`` entries summed into one entry per model
version, so that a client sees the totals of every replica as it would see one server's."""
from __future__ import annotations

from typing import Any

# Lists of entries in Triton's statistics, and the fields that identify an entry (summed with its match).
KEYED_LISTS = {"batch_stats": ("batch_size",), "memory_usage": ("type", "id")}
IDENTITY = {"name", "version", "batch_size", "type", "id"}  # the same in every replica's answer: kept
LATEST = {"last_inference"}  # a timestamp (ms since the epoch): the latest replica's


def summed(answers: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One ``model_stats`` entry per (model, version) of the replicas' ``answers``: every count and duration
    summed (``inference_count``, ``execution_count``, ``inference_stats``, ``response_stats``, ``batch_stats``
    by batch size, ``memory_usage`` by type and device id), ``last_inference`` the latest of them."""
    return _merge_list([entry for answer in answers for entry in answer], ("name", "version"))


def _merge_list(entries: list[dict[str, Any]], identity: tuple[str, ...]) -> list[dict[str, Any]]:
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for entry in entries:
        key = tuple(entry[field] for field in identity)
        merged[key] = _add(merged[key], entry) if key in merged else entry
    return [merged[key] for key in sorted(merged)]


def _add(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """``total`` and ``more`` (entries of the same shape), field by field."""
    result = dict(total)
    for field, value in more.items():
        if field not in result or field in IDENTITY:
            result.setdefault(field, value)
        elif field in LATEST:
            result[field] = max(result[field], value)
        elif field in KEYED_LISTS:
            result[field] = _merge_list([*result[field], *value], KEYED_LISTS[field])
        elif isinstance(value, dict):
            result[field] = _add(result[field], value)
        else:
            result[field] += value
    return result
