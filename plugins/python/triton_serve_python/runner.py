"""Inside the worker: loads ``model.py``, calls TritonPythonModel's methods, checks what ``execute`` returns."""
from __future__ import annotations

import asyncio
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .arena import read_tensor
from .pb_utils.bls import calling_requests
from .pb_utils.dtypes import BY_NAME
from .pb_utils.errors import TritonError
from .pb_utils.messages import InferenceRequest, InferenceResponse, InferenceTrace
from .pb_utils.response_sender import InferenceResponseSender
from .pb_utils.server_link import ServerLink
from .pb_utils.tensor import Tensor
from .protocol import RequestTuple


def load_model_class(model_file: str) -> type:
    """Import ``model_file`` (its folder first on ``sys.path``, as Triton does) and return TritonPythonModel."""
    path = Path(model_file)
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    model_class = getattr(module, "TritonPythonModel", None)
    if not isinstance(model_class, type):
        raise AttributeError(f"{path.name} defines no class TritonPythonModel")
    return model_class


class ModelRunner:
    """One TritonPythonModel object and the calls the server asks for; ``async def`` methods are awaited."""

    def __init__(self, model_file: str, model_name: str, model_version: int, all_outputs: Sequence[str], *,
                 decoupled: bool, link: ServerLink) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.all_outputs = list(all_outputs)
        self.decoupled = decoupled
        self.link = link
        model_class = load_model_class(model_file)
        if not callable(getattr(model_class, "execute", None)):
            raise AttributeError(f"TritonPythonModel of python model '{model_name}' has no execute method")
        self.model = model_class()
        self._loop: asyncio.AbstractEventLoop | None = None

    def initialize(self, args: dict[str, str]) -> None:
        if hasattr(self.model, "initialize"):
            self._call(self.model.initialize, args)

    def finalize(self) -> None:
        try:
            if hasattr(self.model, "finalize"):
                self._call(self.model.finalize)
        finally:
            if self._loop is not None:
                self._loop.close()

    def execute(self, requests: list[RequestTuple], input_buffer: memoryview,
                keys: Sequence[int]) -> list[InferenceResponse | None]:
        """Run one batch (``keys``: the server's key for each request): one returned response per request, or
        None where the request is answered through its response sender. Raise TritonError if ``execute``
        returns something else (Triton's messages)."""
        batch = [self._request(request, input_buffer, key) for request, key in zip(requests, keys)]
        token = calling_requests.set(tuple(keys))
        try:
            return self._checked(self._call(self.model.execute, batch), batch)
        except BaseException:
            for request in batch:  # the batch fails as a whole: the server answers every request
                request._sender._close()  # type: ignore[union-attr]
            raise
        finally:
            calling_requests.reset(token)

    def _request(self, request: RequestTuple, input_buffer: memoryview, key: int) -> InferenceRequest:
        request_id, correlation_id, flags, timeout, outputs, parameters, refs = request
        inputs = [Tensor._typed(ref[0], read_tensor(input_buffer, ref, copy=False), BY_NAME[ref[1]]) for ref in refs]
        built = InferenceRequest(
            model_name=self.model_name, model_version=self.model_version, inputs=inputs,
            requested_output_names=outputs or self.all_outputs, request_id=request_id,
            correlation_id=correlation_id, flags=flags, timeout=timeout, trace=InferenceTrace(key),
            parameters=parameters)
        built._sender = InferenceResponseSender(self.link, key, self.decoupled)
        return built

    def _checked(self, responses: Any, batch: list[InferenceRequest]) -> list[InferenceResponse | None]:
        if responses is None:
            return [None] * len(batch)
        if self.decoupled:
            raise TritonError(f"Python model '{self.model_name}' is using the decoupled mode and the execute "
                              "function must return None.")
        if not isinstance(responses, list):
            raise TritonError(f"Expected a list in the execute return, found type '{type(responses)}'.")
        if len(responses) != len(batch):
            raise TritonError("Number of InferenceResponse objects do not match the number of InferenceRequest "
                              f"objects. InferenceRequest(s) size is:{len(batch)}, and InferenceResponse(s) size "
                              f"is:{len(responses)}\n")
        for request, response in zip(batch, responses):
            if response is None:
                continue
            if not isinstance(response, InferenceResponse):
                raise TritonError("Expected an 'InferenceResponse' object in the execute function return list, "
                                  f"found type '{type(response)}'.")
            request._sender._returned()  # type: ignore[union-attr]
        return list(responses)

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        result = method(*args)
        if inspect.isawaitable(result):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(result)
        return result
