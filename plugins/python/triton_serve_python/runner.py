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
from .pb_utils.dtypes import BY_NAME
from .pb_utils.errors import TritonError
from .pb_utils.messages import InferenceRequest, InferenceResponse
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

    def __init__(self, model_file: str, model_name: str, model_version: int, all_outputs: Sequence[str]) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.all_outputs = list(all_outputs)
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

    def execute(self, requests: list[RequestTuple], input_buffer: memoryview) -> list[InferenceResponse]:
        """Run one batch; raise TritonError if ``execute`` does not return one response per request."""
        batch = [self._request(request, input_buffer) for request in requests]
        responses = self._call(self.model.execute, batch)
        return self._checked(responses, len(batch))

    def _request(self, request: RequestTuple, input_buffer: memoryview) -> InferenceRequest:
        request_id, correlation_id, flags, timeout, outputs, parameters, refs = request
        inputs = [Tensor._typed(ref[0], read_tensor(input_buffer, ref, copy=False), BY_NAME[ref[1]]) for ref in refs]
        return InferenceRequest(
            model_name=self.model_name, model_version=self.model_version, inputs=inputs,
            requested_output_names=outputs or self.all_outputs, request_id=request_id,
            correlation_id=correlation_id, flags=flags, timeout=timeout, parameters=parameters)

    def _checked(self, responses: Any, expected: int) -> list[InferenceResponse]:
        where = f"execute of python model '{self.model_name}'"
        if responses is None:
            raise TritonError(f"{where} returned None; a model that is not decoupled must return a list with "
                              "one pb_utils.InferenceResponse per request")
        if not isinstance(responses, (list, tuple)):
            raise TritonError(f"{where} returned a {type(responses).__name__}; expected a list of "
                              "pb_utils.InferenceResponse, one per request")
        if len(responses) != expected:
            raise TritonError(f"{where} returned {len(responses)} responses for {expected} requests")
        for index, response in enumerate(responses):
            if not isinstance(response, InferenceResponse):
                raise TritonError(f"{where} returned a {type(response).__name__} as response {index}; "
                                  "expected a pb_utils.InferenceResponse")
        return list(responses)

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        result = method(*args)
        if inspect.isawaitable(result):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(result)
        return result
