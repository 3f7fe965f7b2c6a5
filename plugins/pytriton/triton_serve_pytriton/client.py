"""PyTriton's clients (``pytriton.client``) as thin wrappers over ``tritonclient``: ``ModelClient``
(HTTP or gRPC, by the URL's scheme; default HTTP), ``FuturesModelClient`` (the same from a thread
pool) and ``DecoupledModelClient`` (gRPC streams, for decoupled models)."""
from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from triton_serve.plugin import ModelConfig as ModelConfigMessage, config_to_json

from .exceptions import PyTritonError


class PyTritonClientError(PyTritonError):
    """A client call failed."""


class PyTritonClientTimeoutError(PyTritonClientError):
    """The server or the model was not ready in time, or a request took too long."""


class PyTritonClientInferenceServerError(PyTritonClientError):
    """The server answered with an error (the inference function's, or the server's)."""


class PyTritonClientValueError(PyTritonClientError):
    """The call's arguments are wrong."""


class PyTritonClientModelDoesntSupportBatchingError(PyTritonClientError):
    """``infer_batch`` on a model without batching."""


def _split_url(url: str) -> tuple[str, str]:
    scheme, _, address = url.rpartition("://")
    scheme = scheme or "http"
    if ":" not in address:
        address += ":8001" if scheme == "grpc" else ":8000"
    return scheme, address


class ModelClient:
    """A synchronous client of one model: ``infer_sample`` (one sample, without the batch dimension)
    and ``infer_batch``; inputs positionally (in the model's input order) or by name."""

    def __init__(self, url: str, model_name: str, model_version: str | None = None, *, lazy_init: bool = True,
                 init_timeout_s: float | None = None, inference_timeout_s: float | None = None,
                 model_config: Any = None, ensure_model_is_ready: bool = True, access_token: str | None = None) -> None:
        self._scheme, self._address = _split_url(url)
        self._model_name, self._model_version = model_name, model_version or ""
        self._init_timeout_s = init_timeout_s if init_timeout_s is not None else 300.0
        self._inference_timeout_s = inference_timeout_s if inference_timeout_s is not None else 60.0
        self._library: Any = grpcclient if self._scheme == "grpc" else httpclient
        if self._scheme == "grpc":
            self._client: Any = grpcclient.InferenceServerClient(self._address)
        else:
            self._client = httpclient.InferenceServerClient(self._address, network_timeout=self._inference_timeout_s,
                                                            connection_timeout=self._inference_timeout_s)
        self._config: dict[str, Any] | None = None
        if not lazy_init:
            self.wait_for_model(self._init_timeout_s)

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection."""
        self._client.close()

    def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the server and the model are ready (PyTritonClientTimeoutError past ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._client.is_server_live() and self._client.is_model_ready(self._model_name, self._model_version):
                    break
            except (InferenceServerException, OSError):
                pass
            if time.monotonic() > deadline:
                raise PyTritonClientTimeoutError(f"model '{self._model_name}' was not ready within {timeout_s} s")
            time.sleep(0.1)
        if self._config is None:
            config = self._client.get_model_config(self._model_name, self._model_version)
            if self._scheme == "grpc":  # Triton's JSON, as HTTP gives it (protobuf's JSON writes int64 as text)
                self._config = config_to_json(ModelConfigMessage.FromString(config.config.SerializeToString()))
            else:
                self._config = config

    @property
    def model_config(self) -> dict[str, Any]:
        """The model's config, as Triton's JSON."""
        if self._config is None:
            self.wait_for_model(self._init_timeout_s)
        assert self._config is not None
        return self._config

    @property
    def is_batching_supported(self) -> bool:
        """Whether the model takes a batch dimension."""
        return int(self.model_config.get("max_batch_size", 0)) > 0

    def infer_sample(self, *inputs: np.ndarray, parameters: dict[str, Any] | None = None,
                     headers: dict[str, Any] | None = None, **named_inputs: np.ndarray) -> dict[str, np.ndarray]:
        """Infer one sample: inputs without the batch dimension, outputs likewise."""
        named = self._named(inputs, named_inputs)
        if self.is_batching_supported:
            named = {name: value[np.newaxis, ...] for name, value in named.items()}
            return {name: value[0] for name, value in self._infer(named, parameters, headers).items()}
        return self._infer(named, parameters, headers)

    def infer_batch(self, *inputs: np.ndarray, parameters: dict[str, Any] | None = None,
                    headers: dict[str, Any] | None = None, **named_inputs: np.ndarray) -> dict[str, np.ndarray]:
        """Infer a batch: inputs and outputs with the batch dimension first."""
        if not self.is_batching_supported:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {self._model_name} doesn't support batching - use infer_sample method instead")
        return self._infer(self._named(inputs, named_inputs), parameters, headers)

    def _named(self, inputs: tuple[np.ndarray, ...], named: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if inputs and named:
            raise PyTritonClientValueError("Use either positional either keyword method arguments convention")
        if inputs:
            return {spec["name"]: value for spec, value in zip(self.model_config.get("input", []), inputs)}
        return named

    def _wire_inputs(self, named: dict[str, np.ndarray]) -> list[Any]:
        wired = []
        for name, value in named.items():
            if value.dtype.kind == "U":
                value = np.char.encode(value, "utf-8")
            tensor = self._library.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value)
            wired.append(tensor)
        return wired

    def _infer(self, named: dict[str, np.ndarray], parameters: dict[str, Any] | None,
               headers: dict[str, Any] | None) -> dict[str, np.ndarray]:
        if self.model_config.get("model_transaction_policy", {}).get("decoupled"):
            raise PyTritonClientInferenceServerError("Model config is decoupled. Use DecoupledModelClient instead.")
        extra = {"client_timeout": self._inference_timeout_s} if self._scheme == "grpc" else {}
        try:
            result = self._client.infer(self._model_name, self._wire_inputs(named), model_version=self._model_version,
                                        parameters=parameters, headers=headers, **extra)
        except InferenceServerException as error:
            raise PyTritonClientInferenceServerError(
                f"Error occurred during inference request. Message: {error.message()}") from error
        return {spec["name"]: result.as_numpy(spec["name"]) for spec in self.model_config.get("output", [])
                if result.as_numpy(spec["name"]) is not None}


class DecoupledModelClient(ModelClient):
    """A client of a decoupled model over a gRPC stream: ``infer_sample`` / ``infer_batch`` return an
    iterator of the responses' outputs."""

    def __init__(self, url: str, model_name: str, model_version: str | None = None, **kwargs: Any) -> None:
        scheme, address = _split_url(url)
        if scheme != "grpc":
            raise PyTritonClientValueError("DecoupledModelClient supports only the gRPC protocol (grpc://...)")
        super().__init__(f"grpc://{address}", model_name, model_version, **kwargs)

    def infer_sample(self, *inputs: np.ndarray, parameters: dict[str, Any] | None = None,  # type: ignore[override]
                     headers: dict[str, Any] | None = None, **named_inputs: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
        """Stream one sample's responses (each without the batch dimension)."""
        named = self._named(inputs, named_inputs)
        if self.is_batching_supported:
            named = {name: value[np.newaxis, ...] for name, value in named.items()}
            return ({name: value[0] for name, value in outputs.items()}
                    for outputs in self._stream(named, parameters, headers))
        return self._stream(named, parameters, headers)

    def infer_batch(self, *inputs: np.ndarray, parameters: dict[str, Any] | None = None,  # type: ignore[override]
                    headers: dict[str, Any] | None = None, **named_inputs: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
        """Stream a batch's responses."""
        return self._stream(self._named(inputs, named_inputs), parameters, headers)

    def _stream(self, named: dict[str, np.ndarray], parameters: dict[str, Any] | None,
                headers: dict[str, Any] | None) -> Iterator[dict[str, np.ndarray]]:
        received: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._client.start_stream(callback=lambda result, error: received.put(error or result), headers=headers)
        try:
            self._client.async_stream_infer(self._model_name, self._wire_inputs(named),
                                            model_version=self._model_version, parameters=parameters,
                                            enable_empty_final_response=True)
            while True:
                try:
                    item = received.get(timeout=self._inference_timeout_s)
                except queue.Empty:
                    raise PyTritonClientTimeoutError("no response within the inference timeout") from None
                if isinstance(item, InferenceServerException):
                    raise PyTritonClientInferenceServerError(item.message())
                response = item.get_response()
                outputs = {output.name: item.as_numpy(output.name) for output in response.outputs}
                if outputs:
                    yield outputs
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        finally:
            self._client.stop_stream()


class FuturesModelClient:
    """``ModelClient`` calls run on a thread pool: each call returns a ``concurrent.futures.Future``."""

    def __init__(self, url: str, model_name: str, model_version: str | None = None, *, max_workers: int = 8,
                 **kwargs: Any) -> None:
        self._args = (url, model_name, model_version)
        self._kwargs = kwargs
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="pytriton-client")

    def __enter__(self) -> FuturesModelClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _client(self) -> ModelClient:
        return ModelClient(*self._args, **self._kwargs)

    def infer_sample(self, *inputs: np.ndarray, **named: Any) -> Future[dict[str, np.ndarray]]:
        """``ModelClient.infer_sample`` on the pool."""
        return self._pool.submit(lambda: self._with_client(lambda c: c.infer_sample(*inputs, **named)))

    def infer_batch(self, *inputs: np.ndarray, **named: Any) -> Future[dict[str, np.ndarray]]:
        """``ModelClient.infer_batch`` on the pool."""
        return self._pool.submit(lambda: self._with_client(lambda c: c.infer_batch(*inputs, **named)))

    def wait_for_model(self, timeout_s: float) -> Future[None]:
        """``ModelClient.wait_for_model`` on the pool."""
        return self._pool.submit(lambda: self._with_client(lambda c: c.wait_for_model(timeout_s)))

    def _with_client(self, call: Any) -> Any:
        client = self._client()
        try:
            return call(client)
        finally:
            client.close()

    def close(self, wait: bool = True) -> None:
        """Stop the pool (waiting for calls in progress when ``wait``)."""
        self._pool.shutdown(wait=wait)


__all__ = ["DecoupledModelClient", "FuturesModelClient", "ModelClient", "PyTritonClientError",
           "PyTritonClientInferenceServerError", "PyTritonClientModelDoesntSupportBatchingError",
           "PyTritonClientTimeoutError", "PyTritonClientValueError"]
