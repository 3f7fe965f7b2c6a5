"""A bound function's results checked and turned into response content, as PyTriton checks them (in the server, or
in the function's worker process: only the light ``triton_serve.worker`` is imported)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from triton_serve.worker import RequestContent, ResponseContent, ServerError, Status, Tensor

from .model_config import TritonModelConfig, config_type, is_bytes_dtype


def _internal(message: str) -> ServerError:
    return ServerError(message, Status.INTERNAL)


def to_responses(config: TritonModelConfig, strict: bool, requests: Sequence[RequestContent], results: Any,
                 partial: bool = False, response_type: type[ResponseContent] = ResponseContent) -> list[ResponseContent]:
    """One response per request from ``results`` (a list of dicts of arrays, one per request), as
    ``response_type``. The whole list being wrong raises; one request's wrong outputs fail that request alone.
    ``partial``: a decoupled model's response, which may carry only some of the outputs."""
    name = config.model_name
    if not isinstance(results, list):
        raise _internal(f"Outputs returned by `{name}` model callable must be list of response dicts with numpy "
                        f"arrays. Got outputs={results!r} instead.")
    if len(results) != len(requests):
        raise _internal(f"Number of outputs returned by `{name}` inference callable ({len(results)}) does not "
                        f"match number of requests ({len(requests)}) received from Triton.")
    return [_response(config, strict, request, result, partial, response_type)
            for request, result in zip(requests, results)]


def _response(config: TritonModelConfig, strict: bool, request: RequestContent, result: Any, partial: bool,
              response_type: type[ResponseContent]) -> ResponseContent:
    try:
        if not isinstance(result, dict):
            raise _internal(f"Outputs returned by `{config.model_name}` model callable must be list of response "
                            f"dicts with numpy arrays. Got response={result!r} instead.")
        declared = {spec.name: spec for spec in config.outputs or ()}
        tensors = []
        for output, value in result.items():
            spec = declared.get(output)
            if spec is None:
                if strict:
                    raise _internal(f"Returned output `{output}` is not defined in model config for model "
                                    f"`{config.model_name}`.")
                continue  # PyTriton drops what the config does not declare
            tensors.append(_tensor(config, strict, output, spec, value))
        if not partial:
            wanted = [o.name for o in request.outputs] or list(declared)
            missing = [output for output in wanted if output not in result]
            if missing:
                raise _internal(f"model '{config.model_name}' returned no output "
                                + ", ".join(f"'{output}'" for output in missing))
        return response_type(outputs=tuple(tensors))
    except ServerError as error:
        return response_type(error=error)


def _tensor(config: TritonModelConfig, strict: bool, output: str, spec: Any, value: Any) -> Tensor:
    model = config.model_name
    if not isinstance(value, np.ndarray):
        raise _internal(f"model '{model}' returned output '{output}' as {type(value).__name__}; "
                        "outputs must be numpy arrays")
    if is_bytes_dtype(spec.dtype):
        if value.dtype.kind not in "SUO":
            raise _internal(f"Returned output `{output}` for model `{model}` has invalid type. Returned: "
                            f"{value.dtype} ({value.dtype.kind}). Expected: {spec.dtype}.")
        value = _as_bytes_objects(value)
    elif value.dtype.kind not in "biuf":
        raise _internal(f"Returned output `{output}` for model `{model}` has invalid type. Returned: "
                        f"{value.dtype} ({value.dtype.kind}). Expected: {np.dtype(spec.dtype)}.")
    elif value.dtype != np.dtype(spec.dtype):
        if strict and not np.issubdtype(value.dtype, spec.dtype):
            raise _internal(f"Returned output `{output}` for model `{model}` has invalid type. Returned: "
                            f"{value.dtype} ({value.dtype.kind}). Expected: {np.dtype(spec.dtype)}.")
        value = value.astype(spec.dtype)  # PyTriton casts to the declared type
    if strict:
        dims = value.shape[1:] if config.batching else value.shape
        if len(dims) != len(spec.shape) or any(have != want != -1 for have, want in zip(dims, spec.shape)):
            raise _internal(f"Returned output `{output}` for model `{model}` has invalid shapes. Returned: "
                            f"{tuple(dims)}. Expected: {tuple(spec.shape)}.")
    return Tensor(output, config_type(spec.dtype)[len("TYPE_"):].replace("STRING", "BYTES"), tuple(value.shape), value)


def _as_bytes_objects(value: np.ndarray) -> np.ndarray:
    if value.dtype.kind == "O" and all(isinstance(item, bytes) for item in value.flat):
        return value
    encoded = [item.encode("utf-8") if isinstance(item, str) else bytes(item) for item in value.flat]
    converted = np.empty(value.shape, dtype=object)
    converted.ravel()[:] = encoded  # element by element: numpy would read equal-length bytes as one array
    return converted
