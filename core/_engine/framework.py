"""FrameworkInstance: the model instance of an in-process framework, run on a thread of its own."""
from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from .backend import InstanceSpec, Model, ModelInstance
from .batch import concat_inputs, split_outputs
from .errors import ServerError, Status
from .inference import InferenceRequest, InferenceResponse

T = TypeVar("T")


class FrameworkInstance(ModelInstance):
    """An instance whose framework runs on one thread of its own, as Triton runs each instance.

    A framework backend writes ``open`` (load the model for ``spec.kind`` / ``spec.device_id``), ``run``
    (one batch) and, where something must be freed, ``close``. All three run on the instance's
    thread (named ``<model>/<version>/<instance>``), one at a time, in that order: state that a
    framework binds to a thread (the current CUDA device, a stream) stays valid, no lock is needed
    between them, and the event loop stays free while they block. ``execute`` concatenates the
    batch's inputs (``concat_inputs``), runs them and splits the outputs into one response per
    request (``split_outputs``).
    """

    def __init__(self, model: Model, spec: InstanceSpec) -> None:
        super().__init__(model, spec)
        self.thread_name = f"{model.spec.name}/{model.spec.version}/{spec.name}"
        self._thread: ThreadPoolExecutor | None = None

    @abstractmethod
    def open(self) -> None:
        """Instance thread, once, when the instance loads: load the model into the framework.
        Raise to fail the load, after freeing what it took (``close`` is not called then)."""

    @abstractmethod
    def run(self, inputs: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Instance thread: run one batch. ``inputs``: every request's array of each input, concatenated
        along the batch dimension (a ragged input flattened to one dimension); return the config's
        outputs by name, batch dimension first when max_batch_size > 0 (each response keeps those its
        request asked for). Raising fails every request of the batch (a ServerError keeps its status)."""

    def close(self) -> None:
        """Instance thread, once, when the instance unloads, after the last ``run`` returned: free what
        ``open`` took. The thread ends after it."""

    async def load(self) -> None:
        """Event loop: start the instance's thread and ``open`` on it."""
        thread = ThreadPoolExecutor(max_workers=1, initializer=self._name_thread)
        try:
            await _call(thread, self.open)
        except BaseException:
            thread.shutdown(wait=False)
            raise
        self._thread = thread

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse]:
        """Event loop: ``concat_inputs``, ``run`` on the instance's thread, ``split_outputs``. A backend
        that answers some requests itself (an error for one request alone) overrides it and passes
        the others to ``super().execute``."""
        if self._thread is None:
            raise ServerError(f"instance '{self.spec.name}' of model '{self.model.spec.name}' is not loaded",
                              Status.UNAVAILABLE)
        config = self.model.spec.config
        inputs = concat_inputs(requests, config)
        outputs = await _call(self._thread, self.run, inputs)
        return split_outputs(outputs, requests, config)

    async def on_thread(self, function: Callable[..., T], *args: object) -> T:
        """Event loop: ``function(*args)`` on the instance's thread, after what it runs now (a backend
        whose ``execute`` does not fit ``run``'s one array per input calls its framework through this)."""
        if self._thread is None:
            raise ServerError(f"instance '{self.spec.name}' of model '{self.model.spec.name}' is not loaded",
                              Status.UNAVAILABLE)
        return await _call(self._thread, function, *args)

    async def unload(self) -> None:
        """Event loop: ``close`` on the instance's thread, once the batch it may still run returned;
        then the thread ends."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            await _call(thread, self.close)
        finally:
            thread.shutdown(wait=False)

    def _name_thread(self) -> None:
        threading.current_thread().name = self.thread_name


async def _call(thread: ThreadPoolExecutor, function: Callable[..., T], *args: object) -> T:
    """``function(*args)`` on ``thread``, in the caller's context (as ``asyncio.to_thread`` runs it)."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(thread, functools.partial(context.run, function, *args))
