"""Inside the worker: loads ``model.py``, calls TritonPythonModel's methods, checks what ``execute`` returns."""
from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from triton_serve.worker import decode_content

from .pb_utils.bls import calling_requests
from .pb_utils.dtypes import BY_NAME
from .pb_utils.errors import TritonError
from .pb_utils.messages import InferenceRequest, InferenceResponse, InferenceTrace
from .pb_utils.model_dir import set_model_dir
from .pb_utils.response_sender import InferenceResponseSender
from .pb_utils.server_link import ServerLink
from .pb_utils.tensor import Tensor
from .protocol import RequestTuple

_PACKAGE = str(Path(__file__).resolve().parent)  # frames here are Triton's C++ side, left out of error texts
_ASYNCIO = str(Path(asyncio.__file__).resolve().parent)
log = logging.getLogger("triton_serve_python.model")


class ExecuteReturnError(TritonError):
    """What ``execute`` returned breaks Triton's rules (the stub's own check: its text has no exception type)."""


def execute_failure(error: BaseException, model_instance_name: str) -> str:
    """Triton's text for a batch whose ``execute`` failed: the instance and, for an exception raised by the model,
    its type, message and frames as pybind11 writes them (innermost first, ``  file(line): function``)."""
    if isinstance(error, ExecuteReturnError):
        detail = error.message()
    else:
        detail = f"{type(error).__name__}: {str(error) or '<EMPTY MESSAGE>'}"
        frames = _model_frames(error)
        if frames:
            detail += "\n\nAt:\n" + "".join(f"  {frame.f_code.co_filename}({frame.f_lineno}): "
                                           f"{frame.f_code.co_name}\n" for frame in frames)
    return f"Failed to process the request(s) for model '{model_instance_name}', message: {detail}"


def _model_frames(error: BaseException) -> list[FrameType]:
    """The frames from where ``error`` was raised out to the model's ``execute``, without pb_utils' own."""
    tb = error.__traceback__
    if tb is None:
        return []
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame: FrameType | None = tb.tb_frame
    frames: list[FrameType] = []
    while frame is not None:
        filename = str(Path(frame.f_code.co_filename).resolve()) if frame.f_code.co_filename[:1] != "<" else ""
        if filename.startswith((_PACKAGE, _ASYNCIO)):
            if frames:  # out of the model, back in the worker (or the event loop running it)
                break
        else:
            frames.append(frame)
        frame = frame.f_back
    return frames


def load_model_class(model_file: str) -> type:
    """Import ``model_file`` (its folder first on ``sys.path``, as Triton does) and return TritonPythonModel."""
    path = Path(model_file)
    sys.path.insert(0, str(path.parent))
    set_model_dir(model_file)
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
        self._background: set[concurrent.futures.Future[Any]] = set()  # decoupled async executes still running

    def initialize(self, args: dict[str, str]) -> None:
        if hasattr(self.model, "initialize"):
            self._call(self.model.initialize, args)

    @property
    def has_is_ready(self) -> bool:
        return callable(getattr(self.model, "is_ready", None))

    def is_ready(self) -> tuple[bool, str | None]:
        """The model's ``is_ready()`` (sync or async), or (False, why) where it raises or returns no bool."""
        try:
            ready = self._call(self.model.is_ready)
        except Exception as error:
            return False, f"{type(error).__name__}: {error}"
        if not isinstance(ready, bool):
            return False, "is_ready() must return a boolean value"
        return ready, None

    def finalize(self) -> None:
        try:
            if hasattr(self.model, "finalize"):
                self._call(self.model.finalize)
        finally:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)

    def execute(self, requests: list[RequestTuple], input_buffer: memoryview,
                keys: Sequence[int]) -> list[InferenceResponse | None]:
        """Run one batch (``keys``: the server's key for each request): one returned response per request, or
        None where the request is answered through its response sender. Raise TritonError if ``execute``
        returns something else (Triton's messages)."""
        batch = [self._request(request, input_buffer, key) for request, key in zip(requests, keys)]
        token = calling_requests.set(tuple(keys))
        try:
            returned = self.model.execute(batch)
            # the usual returns, a list or None, are never awaitable: they skip inspect's slower check
            if returned is not None and type(returned) is not list and inspect.isawaitable(returned):
                if self.decoupled:  # as Triton: runs on in the background, execute counts as returned
                    self._run_in_background(returned, batch)
                    return [None] * len(batch)
                returned = self._await(returned)
            return self._checked(returned, batch)
        except BaseException:
            for request in batch:  # the batch fails as a whole: the server answers every request
                request._sender._close()  # type: ignore[union-attr]
            raise
        finally:
            calling_requests.reset(token)

    def _run_in_background(self, pending: Any, batch: list[InferenceRequest]) -> None:
        future = asyncio.run_coroutine_threadsafe(_awaited(pending), self._event_loop())
        self._background.add(future)
        future.add_done_callback(lambda done: self._background_done(done, batch))

    def _background_done(self, future: concurrent.futures.Future[Any], batch: list[InferenceRequest]) -> None:
        """A decoupled ``async def execute`` ended. Triton only logs its exception; here the requests it left
        without their final response also end, with Triton's text for the failure, so no client waits forever."""
        self._background.discard(future)
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            return
        message = execute_failure(error, self.link.model_instance_name)
        log.error("%s", message)
        for request in batch:
            request._sender._fail(message)  # type: ignore[union-attr]

    def _request(self, request: RequestTuple, input_buffer: memoryview, key: int) -> InferenceRequest:
        meta, correlation_id, flags, timeout = request
        content = decode_content(self.link.request_type, meta, input_buffer)
        inputs = [Tensor._typed(tensor.name, tensor.data, BY_NAME[tensor.datatype]) for tensor in content.inputs]
        outputs = [output.name for output in content.outputs] or self.all_outputs
        return InferenceRequest._received(
            self.model_name, self.model_version, inputs, outputs, content.id, correlation_id, flags, timeout,
            InferenceTrace(key), content.parameters, InferenceResponseSender(self.link, key, self.decoupled))

    def _checked(self, responses: Any, batch: list[InferenceRequest]) -> list[InferenceResponse | None]:
        if responses is None:
            return [None] * len(batch)
        if self.decoupled:
            raise ExecuteReturnError(f"Python model '{self.link.model_instance_name}' is using the decoupled mode "
                                     "and the execute function must return None.")  # the stub's name: the instance's
        if not isinstance(responses, list):
            raise ExecuteReturnError(f"Expected a list in the execute return, found type '{type(responses)}'.")
        if len(responses) != len(batch):
            raise ExecuteReturnError("Number of InferenceResponse objects do not match the number of "
                                     f"InferenceRequest objects. InferenceRequest(s) size is:{len(batch)}, and "
                                     f"InferenceResponse(s) size is:{len(responses)}\n")
        for request, response in zip(batch, responses):
            if response is None:
                continue
            if not isinstance(response, InferenceResponse):
                raise ExecuteReturnError("Expected an 'InferenceResponse' object in the execute function return "
                                         f"list, found type '{type(response)}'.")
            request._sender._returned()  # type: ignore[union-attr]
        return list(responses)

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        result = method(*args)
        return self._await(result) if inspect.isawaitable(result) else result

    def _await(self, pending: Any) -> Any:
        """Run ``pending`` on the model's event loop and wait for its result; the tasks it starts run on."""
        return asyncio.run_coroutine_threadsafe(_awaited(pending), self._event_loop()).result()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The model's event loop, started on first use and running on its own daemon thread, as Triton's stub
        does: tasks that ``execute`` starts keep running after it returned (answering through senders)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)  # as Triton: asyncio.get_event_loop() in execute finds it
            threading.Thread(target=self._loop.run_forever, name="model event loop", daemon=True).start()
        return self._loop


async def _awaited(pending: Any) -> Any:
    return await pending
