"""A request's vLLM sampling parameters and prompt, read as Triton's vLLM backend reads them (engine process)."""
from __future__ import annotations

import base64
import io
import json
import types
import typing
from typing import Any

import msgspec
from vllm import SamplingParams
from vllm.lora.request import LoRARequest
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from .protocol import Generate

# The scalar types whose values are converted as Triton's backend converts them ("0.5" -> 0.5, 3.0 -> 3).
_SCALARS = (int, float, str)
_FIELDS = {field.name: field.type for field in msgspec.structs.fields(SamplingParams)}


class BadRequest(ValueError):
    """A request the engine refuses before it runs (an INVALID_ARG error)."""


def request_parameters(message: Generate) -> dict[str, Any]:
    """The request's parameters: its ``sampling_parameters`` JSON object, else the vLLM keys (and ``lora_name``) of
    the request's parameters (the generate extension's)."""
    raw = message.parameters
    if isinstance(raw, dict):
        return {key: value for key, value in raw.items() if key in _FIELDS or key == "lora_name"}
    try:
        parameters = json.loads(raw or "{}")
    except ValueError as error:
        raise BadRequest(f"'sampling_parameters' is not valid JSON: {error}") from None
    if not isinstance(parameters, dict):
        raise BadRequest("'sampling_parameters' must be a JSON object")
    return parameters


def sampling_params(parameters: dict[str, Any], stream: bool) -> SamplingParams:
    """vLLM's SamplingParams of ``parameters`` (without ``lora_name``; raising vLLM's own error for a bad one),
    streamed as deltas or sent once at the end."""
    converted = {key: _converted(key, value) for key, value in parameters.items()}
    converted["output_kind"] = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    return SamplingParams(**converted)


def _converted(key: str, value: Any) -> Any:
    """``value`` as the field ``key`` takes it: structured outputs from their JSON text or object, scalars cast."""
    if key == "structured_outputs":
        fields = json.loads(value) if isinstance(value, str) else value
        if not isinstance(fields, dict):
            raise BadRequest("'structured_outputs' must be a JSON object")
        return StructuredOutputsParams(**fields)
    kind = _FIELDS.get(key)
    if kind is bool:
        if isinstance(value, str):
            if value.lower() not in ("true", "false"):
                raise BadRequest(f"sampling parameter '{key}' must be a boolean, got {value!r}")
            return value.lower() == "true"
        return value
    scalar = _scalar_type(kind)
    if scalar is not None and value is not None and not isinstance(value, bool) and not isinstance(value, scalar):
        try:
            return scalar(value)
        except (TypeError, ValueError):
            raise BadRequest(f"sampling parameter '{key}' must be of type {scalar.__name__}, got {value!r}") from None
    return value


def _scalar_type(kind: Any) -> type | None:
    """int, float or str for a field of that type or of that type or None."""
    if kind in _SCALARS:
        return kind
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        members = [member for member in typing.get_args(kind) if member is not type(None)]
        if len(members) == 1 and members[0] in _SCALARS:
            return members[0]
    return None


def lora_request(name: Any, loras: dict[str, str]) -> LoRARequest | None:
    """The adapter of multi_lora.json that ``lora_name`` names, with Triton's checks and messages (its ids are
    1, 2, ... in the file's order, as Triton's backend numbers them)."""
    if name is None:
        return None
    if not loras:
        raise BadRequest("LoRA feature is not enabled.")
    names = list(loras)
    if name not in loras:
        raise BadRequest(f"LoRA {name} is not supported, we currently support {names}")
    return LoRARequest(str(name), names.index(name) + 1, loras[name])


def prompt(message: Generate) -> Any:
    """The prompt vLLM generates from: the text, with the ``image`` input's images (base64) when there are any."""
    if not message.images:
        return {"prompt": message.prompt}
    from PIL import Image

    try:
        images = [Image.open(io.BytesIO(base64.b64decode(item))).convert("RGB") for item in message.images]
    except (ValueError, OSError) as error:
        raise BadRequest(f"input 'image' holds an image that cannot be read: {error}") from None
    return {"prompt": message.prompt, "multi_modal_data": {"image": images}}
