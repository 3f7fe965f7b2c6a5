"""The protocol-neutral data plane: every HTTP and gRPC handler calls these methods."""
from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from . import __version__
from .caching import ResponseCache
from .config import config_to_json
from .datatypes import element_count, name_of_config_type
from .errors import ServerError, Status, internal, unsupported
from .inference import InferenceRequest, InferenceResponse, Tensor
from .protos.model_config_pb2 import ModelConfig
from .repository import ModelRepository, ModelVersion

SERVER_NAME = "triton"


def _shape_matches(shape: tuple[int, ...], dims: list[int]) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims))


class DataPlane:
    """Health, metadata, inference and repository control, independent of the wire protocol."""

    def __init__(self, repository: ModelRepository, *, strict_readiness: bool = True,
                 extensions: list[str] | None = None, cache: ResponseCache | None = None,
                 control_mode: str = "none") -> None:
        self.repository = repository
        self.control_mode = control_mode
        self.strict_readiness = strict_readiness
        self.extensions = extensions if extensions is not None else []
        self.cache = cache
        self.live = True
        self.accepting = True

    # ---- health and metadata ----------------------------------------------------------------

    def server_ready(self) -> bool:
        if not (self.live and self.accepting):
            return False
        return self.repository.is_ready() if self.strict_readiness else True

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(self.extensions)}

    def model_ready(self, name: str, version: int | None = None) -> bool:
        try:
            self.repository.get_version(name, version)
        except ServerError:
            return False
        return True

    def model_metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        found = self.repository.get_version(name, version)
        config = found.config
        model = self.repository.models[name]
        batch = [-1] if config.max_batch_size > 0 else []

        def describe(tensors: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": name_of_config_type(t.data_type), "shape": batch + list(t.dims)}
                    for t in tensors]

        return {
            "name": name,
            "versions": [str(v.version) for v in sorted(model.versions.values(), key=lambda v: v.version)
                         if v.is_ready()],
            "platform": config.platform or config.backend,
            "inputs": describe(config.input),
            "outputs": describe(config.output),
        }

    def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        return self.repository.get_version(name, version).config

    def model_config_json(self, name: str, version: int | None = None) -> dict[str, Any]:
        return config_to_json(self.model_config(name, version))

    # ---- inference --------------------------------------------------------------------------

    def is_decoupled(self, name: str, version: int | None = None) -> bool:
        return self.repository.get_version(name, version).config.model_transaction_policy.decoupled

    async def infer(self, request: InferenceRequest, decoupled_error: str) -> InferenceResponse:
        """Run a request that expects exactly one response (HTTP /infer, gRPC ModelInfer).

        An error response is raised as ServerError; ``decoupled_error`` is the front-end's
        message for a decoupled model, which this path cannot serve.
        """
        found = self.repository.get_version(request.model_name, request.model_version)
        if found.config.model_transaction_policy.decoupled:
            raise unsupported(decoupled_error)
        ok = False
        try:
            response = await self._infer_once(found, request)
            ok = True
            return response
        finally:
            found.stats.record_end(request.arrival_ns, ok)

    async def _infer_once(self, found: ModelVersion, request: InferenceRequest) -> InferenceResponse:
        key = self._cache_key(found, request)
        if key is not None:
            started = time.monotonic_ns()
            cached = self.cache.lookup(key)  # type: ignore[union-attr]
            (found.stats.cache_hit if cached is not None else found.stats.cache_miss).add(
                time.monotonic_ns() - started)
            if cached is not None:
                return cached
        self._submit(found, request)
        response = self._finish(found, request, await request.single_response())
        if response.error is not None:
            raise response.error
        if key is not None:
            self.cache.insert(key, response)  # type: ignore[union-attr]
        return response

    async def stream(self, request: InferenceRequest) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        """Run a request and yield ``(response, final)`` pairs: 0..N responses for decoupled models.

        Error responses are yielded, not raised, so a stream can carry on after them.
        """
        found = self.repository.get_version(request.model_name, request.model_version)
        ok = False
        try:
            self._submit(found, request)
            ok = True
            async for response, final in request.responses():
                if response is not None:
                    response = self._finish(found, request, response)
                    ok = ok and response.error is None
                yield response, final
        finally:
            found.stats.record_end(request.arrival_ns, ok)

    def _submit(self, found: ModelVersion, request: InferenceRequest) -> None:
        request.model_version = found.version
        validate_request(found.config, request)
        if found.scheduler is None:
            raise internal(f"model '{request.model_name}' version {found.version} has no scheduler")
        request.enqueued_ns = time.monotonic_ns()
        found.scheduler.enqueue(request)

    def _finish(self, found: ModelVersion, request: InferenceRequest,
                response: InferenceResponse) -> InferenceResponse:
        if response.error is not None:
            return response
        try:
            return shape_outputs(found, request, response)
        except ServerError as error:
            return InferenceResponse.from_error(error)

    def _cache_key(self, found: ModelVersion, request: InferenceRequest) -> str | None:
        if self.cache is None or not found.config.response_cache.enable:
            return None
        digest = hashlib.sha256(f"{request.model_name}\0{found.version}".encode())
        for tensor in sorted(request.inputs.values(), key=lambda t: t.name):
            digest.update(f"\0{tensor.name}\0{tensor.datatype}\0{tensor.shape}\0".encode())
            data = tensor.data
            digest.update(repr(data.tolist()).encode() if data.dtype.kind == "O" else np.ascontiguousarray(data))
        for output in request.outputs:
            digest.update(f"\0out\0{output.name}\0{sorted(output.parameters.items())}".encode())
        return digest.hexdigest()

    # ---- statistics -------------------------------------------------------------------------

    def model_statistics(self, name: str = "", version: int | None = None) -> list[dict[str, Any]]:
        """Triton's ``model_stats`` entries: every loaded version of every model when ``name`` is
        empty, else the named model's (one version when given, else each ready version)."""
        if not name:
            if version is not None:
                raise ServerError("statistics for a model version need the model name")
            return [found.stats.as_dict(model_name, found.version)
                    for model_name in sorted(self.repository.models)
                    for found in self._versions_with_stats(model_name)]
        if version is not None:
            found = self.repository.get_version(name, version)
            return [found.stats.as_dict(name, found.version)]
        self.repository.get_version(name)  # the model must exist and be ready
        return [found.stats.as_dict(name, found.version) for found in self._versions_with_stats(name)]

    def _versions_with_stats(self, name: str) -> list[ModelVersion]:
        model = self.repository.models[name]
        return sorted((v for v in model.versions.values() if v.is_ready()), key=lambda v: v.version)

    # ---- repository -------------------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self.repository.index(ready_only)

    def _check_explicit(self) -> None:
        if self.control_mode != "explicit":
            raise ServerError("explicit model load / unload is not allowed if polling is enabled",
                              Status.UNAVAILABLE)

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Load or reload a model (explicit mode only); raise with the reason if it fails."""
        self._check_explicit()
        overrides = [key for key in parameters if key == "config" or key.startswith("file:")]
        if overrides:
            raise unsupported(f"load parameter(s) {overrides} (config and file overrides) are not supported yet")
        model = await self.repository.load(name)
        if model.error:
            raise ServerError(model.error)
        failed = [v for v in model.versions.values() if not v.is_ready()]
        if failed:
            raise ServerError(f"failed to load '{name}' version {failed[0].version}: {failed[0].reason}")

    async def unload_model(self, name: str) -> None:
        self._check_explicit()
        await self.repository.unload(name)


_RESERVED = {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout"}


def apply_reserved_parameters(request: InferenceRequest) -> None:
    """Move the reserved request parameters (sequence, priority, timeout) into request fields."""
    params = request.parameters
    if not _RESERVED.intersection(params):
        return
    try:
        sequence_id = params.get("sequence_id", 0)
        if not isinstance(sequence_id, (int, str)) or isinstance(sequence_id, bool):
            raise TypeError("sequence_id must be an unsigned integer or a string")
        request.sequence_id = sequence_id
        request.sequence_start = _as_bool(params.get("sequence_start", False), "sequence_start")
        request.sequence_end = _as_bool(params.get("sequence_end", False), "sequence_end")
        request.priority = _as_uint(params.get("priority", 0), "priority")
        request.timeout_us = _as_uint(params.get("timeout", 0), "timeout")
    except TypeError as error:
        raise ServerError(f"invalid request parameter for model '{request.model_name}': {error}") from None


def _as_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a boolean")
    return value


def _as_uint(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"{name} must be an unsigned integer")
    return value


def validate_request(config: ModelConfig, request: InferenceRequest) -> None:
    """Check inputs and requested outputs against the config (Triton's messages); apply reshape."""
    name = request.model_name
    apply_reserved_parameters(request)
    declared = {tensor.name: tensor for tensor in config.input}
    for input_name in request.inputs:
        if input_name not in declared:
            raise ServerError(f"unexpected inference input '{input_name}' for model '{name}'")
    missing = [n for n, t in declared.items() if not t.optional and n not in request.inputs]
    if missing:
        raise ServerError(
            f"expected {len(declared)} inputs but got {len(request.inputs)} inputs for model '{name}'. "
            f"Got input(s) {list(request.inputs)}, but missing required input(s) {missing}. "
            "Please provide all required input(s).")
    batching = config.max_batch_size > 0
    batch_size = None
    for tensor in request.inputs.values():
        spec = declared[tensor.name]
        expected_type = name_of_config_type(spec.data_type)
        if tensor.datatype != expected_type:
            raise ServerError(f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                              f"but model '{name}' expects '{expected_type}'")
        dims = list(spec.dims)
        shape = tensor.shape
        if batching:
            if not shape:
                raise ServerError(f"inference input '{tensor.name}' for model '{name}' has no batch dimension; "
                                  f"expected shape {[-1, *dims]}")
            if not 1 <= shape[0] <= config.max_batch_size:
                raise ServerError(f"inference request batch-size must be <= {config.max_batch_size} "
                                  f"for '{name}', got {shape[0]} for input '{tensor.name}'")
            if batch_size is not None and shape[0] != batch_size:
                raise ServerError(f"inputs of a request to model '{name}' must share one batch size; "
                                  f"input '{tensor.name}' has {shape[0]}, another has {batch_size}")
            batch_size = shape[0]
            shape = shape[1:]
        if not _shape_matches(shape, dims):
            expected = [-1, *dims] if batching else dims
            raise ServerError(f"unexpected shape for input '{tensor.name}' for model '{name}'. "
                              f"Expected {expected}, got {list(tensor.shape)}")
        if spec.HasField("reshape"):
            prefix = tensor.shape[:1] if batching else ()
            tensor.data = tensor.data.reshape(prefix + tuple(spec.reshape.shape))
            tensor.shape = tuple(tensor.data.shape)
    declared_outputs = {tensor.name for tensor in config.output}
    for output in request.outputs:
        if output.name not in declared_outputs:
            raise ServerError(f"unexpected inference output '{output.name}' for model '{name}'")


def shape_outputs(found: ModelVersion, request: InferenceRequest, response: InferenceResponse) -> InferenceResponse:
    """Keep only the requested outputs, check them against the config, undo reshape, classify."""
    config = found.config
    declared = {tensor.name: tensor for tensor in config.output}
    wanted = {o.name: o for o in request.outputs}
    outputs: list[Tensor] = []
    for tensor in response.outputs:
        if wanted and tensor.name not in wanted:
            continue
        spec = declared.get(tensor.name)
        if spec is None:
            raise internal(f"model '{request.model_name}' returned output '{tensor.name}', "
                           "which its config does not declare")
        expected_type = name_of_config_type(spec.data_type)
        if tensor.datatype != expected_type:
            raise internal(f"model '{request.model_name}' returned output '{tensor.name}' with datatype "
                           f"'{tensor.datatype}', but its config declares '{expected_type}'")
        batching = config.max_batch_size > 0
        dims = list(spec.dims)
        if spec.HasField("reshape") and (tensor.shape or not batching):
            prefix = tensor.shape[:1] if batching else ()
            if -1 not in dims:
                tensor.data = tensor.data.reshape(prefix + tuple(dims))
                tensor.shape = tuple(tensor.data.shape)
        check_shape = tensor.shape[1:] if batching else tensor.shape
        if not _shape_matches(tuple(check_shape), dims):
            raise internal(f"model '{request.model_name}' returned output '{tensor.name}' with shape "
                           f"{list(tensor.shape)}, which does not match its config dims "
                           f"{([-1] if batching else []) + dims}")
        if element_count(tensor.shape) != tensor.data.size:
            raise internal(f"model '{request.model_name}' returned output '{tensor.name}' whose data holds "
                           f"{tensor.data.size} elements for shape {list(tensor.shape)}")
        requested = wanted.get(tensor.name)
        if requested is not None and "classification" in requested.parameters:
            tensor = classify(tensor, requested.parameters["classification"], found.labels.get(tensor.name),
                              batching)
        elif requested is not None:
            tensor.parameters = dict(requested.parameters)
        outputs.append(tensor)
    missing = set(wanted) - {t.name for t in outputs}
    if missing:
        raise internal(f"model '{request.model_name}' did not return requested output(s) {sorted(missing)}")
    response.outputs = outputs
    return response


def classify(tensor: Tensor, count: Any, labels: list[str] | None, batching: bool) -> Tensor:
    """Triton's classification extension: the top ``count`` values as "value:index[:label]" strings."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ServerError(f"classification count for output '{tensor.name}' must be a positive integer")
    if tensor.datatype == "BYTES":
        raise ServerError(f"output '{tensor.name}' holds BYTES and cannot be classified")
    rows = tensor.data.reshape((tensor.shape[0], -1)) if batching else tensor.data.reshape((1, -1))
    k = min(count, rows.shape[1])
    result = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows):
        for c, index in enumerate(np.argsort(-row.astype(np.float64), kind="stable")[:k]):
            value = row[index]
            text = f"{value:f}" if np.issubdtype(row.dtype, np.floating) else str(value)
            text += f":{index}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            result[r, c] = text.encode()
    shape = tuple(result.shape) if batching else (k,)
    return Tensor(tensor.name, "BYTES", shape, result.reshape(shape), {})
