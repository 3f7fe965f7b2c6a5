"""PyTriton's inference-function decorators (``pytriton.decorators``), with the same behaviour.

An undecorated function takes the list of requests of a batch (each a mapping of input names to
arrays, with ``.parameters``) and returns one dict of output arrays per request. ``@batch`` turns that
into one call with each input stacked along the batch dimension, ``@sample`` into one call per
(unbatched) request; the others group, pad or fill inputs around them.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import operator
from bisect import bisect_left
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import numpy as np
import wrapt

from triton_serve.worker import serialize_bytes

from .exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from .model_config import TritonModelConfig

TRITON_CONTEXT_FIELD_NAME = "triton_context"
_SPECIAL_KEYS = ("__triton_context__",)
InferenceRequest = dict[str, np.ndarray]
InferenceResult = dict[str, np.ndarray]


class ModelConfigDict(MutableMapping[Any, TritonModelConfig]):
    """Model configs by inference function. A function and the decorators around it share one key
    (wrapt proxies give the wrapped function's ``str``), so any layer finds the model it serves."""

    def __init__(self) -> None:
        self._data: dict[str, TritonModelConfig] = {}
        self._keys: list[Any] = []

    @staticmethod
    def _key(function: Any) -> str:
        if inspect.ismethod(function) and function.__name__ == "__call__":
            function = function.__self__
        return str(function)

    def __getitem__(self, function: Any) -> TritonModelConfig:
        return self._data[self._key(function)]

    def __setitem__(self, function: Any, config: TritonModelConfig) -> None:
        self._keys.append(function)
        self._data[self._key(function)] = config

    def __delitem__(self, function: Any) -> None:
        del self._data[self._key(function)]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._data)


@dataclasses.dataclass
class TritonContext:
    """What ``@triton_context`` passes to a function: the configs of the models it is bound to."""

    model_configs: ModelConfigDict = dataclasses.field(default_factory=ModelConfigDict)


def get_triton_context(wrapped: Any, instance: Any) -> TritonContext:
    """The TritonContext that binding attached to a function (or to the object whose method it is)."""
    owner = instance or wrapped
    context = getattr(owner, "__triton_context__", None)
    if context is None:
        raise PyTritonValidationError("Wrapped function or object must bound with triton to get  __triton_context__")
    return context


def get_model_config(wrapped: Any, instance: Any) -> TritonModelConfig:
    """The config of the model a function is bound to (for decorators that need it)."""
    return get_triton_context(wrapped, instance).model_configs[wrapped]


def get_inference_request_batch_size(request: InferenceRequest) -> int:
    """The batch size of a request: the first dimension of its first input."""
    return int(next(iter(request.values())).shape[0])


def convert_output(outputs: Any, wrapped: Any = None, instance: Any = None,
                   model_config: TritonModelConfig | None = None) -> InferenceResult:
    """A function's result as a dict: a list or tuple is matched to the model's outputs in order."""
    if isinstance(outputs, dict):
        return outputs
    if isinstance(outputs, (list, tuple)):
        config = model_config if model_config is not None else get_model_config(wrapped, instance)
        declared = list(config.outputs or ())
        if len(outputs) != len(declared):
            raise PyTritonValidationError("Outputs length different than config outputs length")
        return {spec.name: value for spec, value in zip(declared, outputs)}
    raise PyTritonValidationError(f"Unsupported output type {type(outputs)}.")


@wrapt.decorator
def sample(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> list[InferenceResult]:
    """For models without batching: call the function with the first request's inputs as keyword
    arguments and return its result as the one response."""
    kwargs.update(args[0][0])
    return [convert_output(wrapped(*args[1:], **kwargs), wrapped, instance)]


@wrapt.decorator
def batch(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """Stack the requests' inputs along the batch dimension, call the function once with them as
    keyword arguments, and split each output back into one response per request (a generator
    function's results one by one, for decoupled models)."""
    requests = args[0]
    names = requests[0].keys()
    if any(request.keys() != names for request in requests[1:]):
        raise PyTritonValidationError("Cannot batch requests with different set of inputs keys")
    stacked = {name: np.concatenate([request[name] for request in requests]) for name in names}
    outputs = wrapped(*args[1:], **{**kwargs, **stacked})
    sizes = [get_inference_request_batch_size(request) for request in requests]

    def split(result: Any) -> list[InferenceResult]:
        result = convert_output(result, wrapped, instance)
        for name, value in result.items():
            if not isinstance(value, np.ndarray):
                raise PyTritonValidationError(f"the function returned output '{name}' as {type(value).__name__}; "
                                              "outputs must be numpy arrays")
        total = sum(sizes)
        wrong = {name: value.shape for name, value in result.items() if value.shape[0] != total}
        if wrong:
            raise ValueError("Received output tensors with different batch sizes: "
                             + ", ".join(f"{name}: {shape}" for name, shape in wrong.items())
                             + f". Expected batch size: {total}. ")
        starts = list(itertools.accumulate(sizes, initial=0))
        return [{name: value[start:start + size] for name, value in result.items()}
                for start, size in zip(starts, sizes)]

    if inspect.isgenerator(outputs):
        return (split(result) for result in outputs)
    if inspect.isasyncgen(outputs):
        async def split_each() -> Any:
            async for result in outputs:
                yield split(result)
        return split_each()
    if inspect.iscoroutine(outputs):
        async def split_awaited() -> Any:
            return split(await outputs)
        return split_awaited()
    return split(outputs)


def _hashable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype == np.object_ or value.dtype.type == np.bytes_:
            return serialize_bytes(value)
        return value.tobytes()
    return value


def group_by_values(*keys: str, pad_fn: Callable[[Any], Any] | None = None) -> Any:
    """Split a batch (after ``@batch``) into groups of rows with equal values of the ``keys`` inputs,
    call the function once per group and put the rows of the results back in their places.
    ``pad_fn`` (e.g. ``ConstantPadder()``) makes the groups' results the same shape first."""

    @wrapt.decorator
    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> InferenceResult:
        layers = [getattr(layer, "_self_wrapper", None) for layer in _layers(wrapped)]
        if batch in layers:
            raise PyTritonRuntimeError("The @group_by_values decorator must be used after the @batch decorator.")
        inputs = {name: value for name, value in kwargs.items() if name not in _SPECIAL_KEYS}
        special = {name: value for name, value in kwargs.items() if name in _SPECIAL_KEYS}
        size = get_inference_request_batch_size(inputs)
        rows = sorted(range(size), key=lambda row: tuple(_hashable(inputs[key][row]) for key in keys))
        groups = [tuple(group) for _, group in itertools.groupby(
            rows, key=lambda row: tuple(_hashable(inputs[key][row]) for key in keys))]
        results = [wrapped(*args, **{name: value[list(group), ...] for name, value in inputs.items()}, **special)
                   for group in groups]
        if pad_fn is not None:
            results = list(pad_fn(results))
        merged = {name: np.zeros((size,) + value.shape[1:], dtype=value.dtype) for name, value in results[0].items()}
        for group, result in zip(groups, results):
            for name, value in result.items():
                merged[name][list(group), ...] = value
        return merged

    return wrapper


class ConstantPadder:
    """For ``group_by_values(pad_fn=...)``: pads every group's arrays with ``pad_value`` to the largest
    shape among the groups (and byte strings to the longest), so that they stack again."""

    def __init__(self, pad_value: Any = 0) -> None:
        self.pad_value = pad_value

    def __call__(self, batches: list[InferenceResult]) -> list[InferenceResult]:
        names = list(dict.fromkeys(name for result in batches for name in result))
        padded: list[dict[str, np.ndarray]] = [dict() for _ in batches]
        for name in names:
            arrays = [result.get(name) for result in batches]
            present = [array for array in arrays if array is not None]
            shape = tuple(np.max([array.shape[1:] for array in present], axis=0))
            dtype = present[0].dtype
            if any(array.dtype.kind != dtype.kind for array in present):
                raise PyTritonRuntimeError("All input arrays for given input name must have the same dtype.")
            if dtype.kind in "SU":
                dtype = np.dtype(f"{dtype.str[:2]}{max(int(array.dtype.str[2:]) for array in present)}")
            elif any(array.dtype != dtype for array in present):
                raise PyTritonRuntimeError("All input arrays for given input name must have the same dtype.")
            fill = b"" if dtype.kind in "SUO" else self.pad_value
            for index, array in enumerate(arrays):
                if array is not None:
                    widths = [(0, 0)] + [(0, want - have) for have, want in zip(array.shape[1:], shape)]
                    padded[index][name] = np.pad(array, widths, mode="constant", constant_values=fill).astype(dtype)
        return padded


@wrapt.decorator
def group_by_keys(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> list[InferenceResult]:
    """Call the function once per group of requests that have the same set of inputs (before
    ``@batch``, which needs one set), and return the results in the requests' order."""
    requests = args[0]
    order = sorted(range(len(requests)), key=lambda index: tuple(sorted(requests[index].keys())))
    results: dict[int, InferenceResult] = {}
    for _, group in itertools.groupby(order, key=lambda index: tuple(sorted(requests[index].keys()))):
        indexes = list(group)
        outputs = wrapped([requests[index] for index in indexes], *args[1:], **kwargs)
        results.update(zip(indexes, outputs))
    return [results[index] for index in range(len(requests))]


def fill_optionals(**defaults: np.ndarray) -> Any:
    """Give requests that lack an optional input its default (a numpy array without the batch
    dimension, repeated along it for batching models). Put it first, so later groupings see full requests."""

    def check(config: TritonModelConfig) -> None:
        inputs = {spec.name: spec for spec in config.inputs or ()}
        unknown = sorted(set(defaults) - set(inputs))
        if unknown:
            raise PyTritonBadParameterError(f"Could not found {', '.join(unknown)} inputs")
        not_arrays = {name: value for name, value in defaults.items() if not isinstance(value, np.ndarray)}
        if not_arrays:
            raise PyTritonBadParameterError(
                f"Could not use {', '.join(f'{k}={v}' for k, v in not_arrays.items())} defaults as they are not "
                "NumPy arrays")
        wrong_types = [f"{name}: dtype={value.dtype} expected_dtype={inputs[name].dtype}"
                       for name, value in defaults.items() if value.dtype != inputs[name].dtype]
        if wrong_types:
            raise PyTritonBadParameterError(f"Could not use {', '.join(wrong_types)} defaults as they have different "
                                            "than input signature dtypes")

        def fits(have: tuple[int, ...], want: tuple[int, ...]) -> bool:
            return len(have) == len(want) and all(w == -1 or h == w for h, w in zip(have, want))

        wrong_shapes = [f"{name}: shape={value.shape} expected_shape={inputs[name].shape}"
                        for name, value in defaults.items() if not fits(value.shape, inputs[name].shape)]
        if wrong_shapes:
            raise PyTritonBadParameterError(f"Could not use {', '.join(wrong_shapes)} defaults as they have different "
                                            "than input signature shapes")

    @wrapt.decorator
    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        config = get_model_config(wrapped, instance)
        check(config)
        for request in args[0]:
            size = get_inference_request_batch_size(request) if config.batching else None
            for name, value in defaults.items():
                if name not in request:
                    request[name] = np.tile(value, (size,) + (1,) * value.ndim) if size is not None else value
        return wrapped(*args, **kwargs)

    return wrapper


@wrapt.decorator
def triton_context(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """Pass the function a ``triton_context`` keyword argument (its ``model_configs[function]`` is the
    config of the model it serves)."""
    kwargs[TRITON_CONTEXT_FIELD_NAME] = get_triton_context(wrapped, instance)
    return wrapped(*args, **kwargs)


@wrapt.decorator
def pad_batch(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """Repeat the last row of each input until the batch has the nearest preferred batch size (or
    ``max_batch_size``) at or above its size."""
    inputs = {name: value for name, value in kwargs.items() if name not in _SPECIAL_KEYS}
    size = next(iter(inputs.values())).shape[0]
    config = get_model_config(wrapped, instance)
    preferred = sorted(config.batcher.preferred_batch_size or []) if config.batcher is not None else []
    sizes = preferred + [config.max_batch_size]
    target = sizes[bisect_left(sizes, size)]
    for name, value in inputs.items():
        repeats = np.ones(value.shape[0], dtype=np.int64)
        repeats[-1] = target - value.shape[0] + 1
        kwargs[name] = np.repeat(value, repeats, axis=0)
    return wrapped(*args, **kwargs)


def first_value(*keys: str, squeeze_single_values: bool = True, strict: bool = True) -> Any:
    """Replace each of the ``keys`` inputs by its first row (a scalar when it holds one value and
    ``squeeze_single_values``); with ``strict``, rows that differ are an error. Works after ``@batch`` or
    on the list of requests; batching models only."""
    refused = [key for key in keys if key in _SPECIAL_KEYS]
    if refused:
        raise PyTritonBadParameterError(
            f"The keys {', '.join(refused)} are not allowed as keys for @first_value wrapper. "
            f"The set of not allowed keys are {', '.join(_SPECIAL_KEYS)}")

    def replace(request: Any) -> Any:
        for key in keys:
            if key not in request:
                continue
            values = request[key]
            if strict and len(np.unique(values, axis=None if values.dtype == object else 0)) > 1:
                raise PyTritonRuntimeError(
                    f"The values on the {key!r} input are not equal. To proceed, either disable strict mode in "
                    f"@first_value wrapper or ensure that the values always are consistent. The current values "
                    f"of {key!r} are {values!r}.")
            first = values[0]
            if squeeze_single_values and not np.isscalar(first) and all(dim == 1 for dim in first.shape):
                first = np.squeeze(first)[()]
            request[key] = first
        return request

    @wrapt.decorator
    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not get_model_config(wrapped, instance).batching:
            raise PyTritonRuntimeError("The @first_value decorator can only be used with models that support batching.")
        if set(kwargs) - set(_SPECIAL_KEYS):
            return wrapped(*args, **replace(kwargs))
        requests, *rest = args
        return wrapped([replace(request) for request in requests], *rest, **kwargs)

    return wrapper


def _layers(function: Any) -> Iterator[Any]:
    while function is not None:
        yield function
        function = getattr(function, "__wrapped__", None)


__all__ = ["ConstantPadder", "ModelConfigDict", "TritonContext", "batch", "convert_output", "fill_optionals",
           "first_value", "get_inference_request_batch_size", "get_model_config", "get_triton_context",
           "group_by_keys", "group_by_values", "pad_batch", "sample", "triton_context"]
