"""The ``pytriton`` backend: serves functions bound with ``Triton.bind`` on the instance threads of
the framework-backend API (or, isolated, through a worker process per instance)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from triton_serve.plugin import (Backend, BackendRegistry, FrameworkInstance, InferenceRequest, InferenceResponse,
                                 InstanceSpec, Model, ModelInstance, ModelSpec, ResponseContent, ServerError, Status,
                                 content_type_names, hookimpl)

from .binding import BINDING_FILE, Binding, find
from .calling import close_thread_loop, requests_of, results_of
from .exceptions import PyTritonUnrecoverableError
from .isolation import WorkerProcess
from .results import to_responses


class FunctionModel(Model):
    """One loaded version of a bound model: the binding its file names."""

    binding: Binding

    async def load(self) -> None:
        """Event loop: find the binding named by the model's binding file."""
        path = self.spec.model_file
        try:
            key = (await asyncio.to_thread(path.read_text)).strip()
        except OSError as error:
            raise ServerError(f"model '{self.spec.name}': cannot read {path.name}: {error}") from None
        binding = find(key)
        if binding is None:
            raise ServerError(f"model '{self.spec.name}' is bound to no function of this process: bind it with "
                              "Triton.bind in the process that serves it")
        self.binding = binding

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return FunctionInstance(self, instance)


class FunctionInstance(FrameworkInstance):
    """One instance: calls its function (the instance's index picks one of the bound functions) on
    the instance's thread, with the batch's requests as PyTriton's ``Request`` list."""

    model: FunctionModel

    def open(self) -> None:
        """Instance thread: pick the function; start its worker process when isolated."""
        binding = self.model.binding
        index = self.spec.index % len(binding.functions)
        self.call: Callable[[Any], Any] = binding.functions[index]
        self.worker: WorkerProcess | None = None
        if binding.isolated:
            self.worker = WorkerProcess(binding.pickled[index], f"{self.model.spec.name}/{self.spec.name}",
                                        content_type_names(), binding.config, binding.strict)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Not used: ``execute`` hands the function whole requests."""
        raise NotImplementedError

    def close(self) -> None:
        """Instance thread: end the worker process, or the thread's event loop."""
        if self.worker is not None:
            self.worker.close()
        close_thread_loop()

    # A decoupled model answers each request itself and returns None, as ModelInstance.execute allows;
    # FrameworkInstance's own execute always returns responses, hence the narrower type it declares.
    async def execute(  # type: ignore[override]
            self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse] | None:
        """Event loop: run the function on the instance's thread. A decoupled model's responses are
        sent as the function yields them; the others are returned."""
        binding = self.model.binding
        if not binding.config.decoupled:
            return await self.on_thread(self._call, requests, None)
        loop = asyncio.get_running_loop()

        def send(responses: list[InferenceResponse]) -> None:
            for request, response in zip(requests, responses):
                if not request.finished:
                    request.send(response, final=response.error is not None)

        try:
            await self.on_thread(self._call, requests, lambda responses: loop.call_soon_threadsafe(send, responses))
        except Exception as error:
            failure = error if isinstance(error, ServerError) else ServerError(
                f"{type(error).__name__}: {error}", Status.INTERNAL)
            for request in requests:
                request.fail(failure)
            if not isinstance(error, ServerError):
                raise  # the scheduler logs it; every request already has its answer
        for request in requests:
            if not request.finished:
                request.send(None, final=True)
        return None

    def _call(self, requests: Sequence[InferenceRequest],
              emit: Callable[[list[InferenceResponse]], Any] | None) -> list[InferenceResponse] | None:
        """Instance thread: the function's results as responses (``emit`` each, for decoupled models)."""
        binding = self.model.binding
        config = binding.config
        contents = [request.content for request in requests]
        default_outputs = [spec.name for spec in config.outputs or ()]
        partial = emit is not None
        checked: Iterator[list[ResponseContent]]
        if self.worker is not None:  # the worker checks each result and sends its responses
            checked = self.worker.call(contents, default_outputs, partial)
        else:
            checked = (to_responses(config, binding.strict, contents, result, partial, InferenceResponse.content_type)
                       for result in results_of(self.call, requests_of(contents, default_outputs)))
        try:
            if emit is not None:
                for responses in checked:
                    emit([InferenceResponse.from_content(response) for response in responses])
                return None
            answered = None
            for responses in checked:
                if answered is not None:
                    raise ServerError(f"model '{config.model_name}' is not decoupled, but its function gave "
                                      "more than one result", Status.INTERNAL)
                answered = [InferenceResponse.from_content(response) for response in responses]
            if answered is None:
                raise ServerError(f"model '{config.model_name}': its function gave no result", Status.INTERNAL)
            return answered
        except PyTritonUnrecoverableError as error:
            if binding.on_unrecoverable is not None:
                binding.on_unrecoverable(error)
            raise


class FunctionBackend(Backend):
    """Serves models whose only file is the binding file ``Triton.bind`` writes."""

    name = "pytriton"
    default_model_filename = BINDING_FILE

    def create_model(self, spec: ModelSpec) -> Model:
        return FunctionModel(self, spec)


@hookimpl
def tserve_register_backends(registry: BackendRegistry) -> None:
    """Register the ``pytriton`` backend."""
    registry.add(FunctionBackend)


