"""One model instance: the model compiled for the CPU, and one InferRequest that runs its batches."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import openvino as ov

from triton_serve.plugin import (InferenceRequest, InferenceResponse, InstanceSpec, ModelInstance, ModelSpec,
                                 ServerError, Status, concat_inputs, request_batch_size, split_outputs)

from .model_file import new_core, openvino_message, read_model
from .parameters import OpenVinoParameters
from .preparation import prepare_model


class OpenVinoInstance(ModelInstance):
    """Reads, fits and compiles the model on ``load`` (in a worker thread) with its own ``ov.Core``;
    ``execute`` concatenates the batch's requests and runs them as one inference in a worker thread
    (OpenVINO releases the GIL while it infers)."""

    def __init__(self, model: ModelSpec, instance: InstanceSpec, parameters: OpenVinoParameters) -> None:
        self.model = model
        self.instance = instance
        self.parameters = parameters
        self.compiled: ov.CompiledModel | None = None
        self._request: ov.InferRequest | None = None

    async def load(self) -> None:
        self.compiled, self._request = await asyncio.to_thread(self._compile)

    def _compile(self) -> tuple[ov.CompiledModel, ov.InferRequest]:
        core = new_core(self.parameters, self.model.name)
        name = self.model.name
        model = prepare_model(read_model(core, self.model), self.model.config, self.parameters, name)
        try:
            compiled = core.compile_model(model, "CPU", self.parameters.compile_properties)
        except RuntimeError as error:
            properties = ", ".join(f"{k}={v}" for k, v in self.parameters.compile_properties.items()) or "defaults"
            raise ServerError(f"model '{name}': OpenVINO cannot compile it for the CPU ({properties}): "
                              f"{openvino_message(error)}") from None
        return compiled, compiled.create_infer_request()

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse]:
        config = self.model.config
        arrays = concat_inputs(requests, config)
        batch = sum(request_batch_size(request, config) for request in requests)
        outputs = await asyncio.to_thread(self._infer, arrays, batch)
        return split_outputs(outputs, requests, config)

    def _infer(self, arrays: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
        if self._request is None:
            raise ServerError(f"model '{self.model.name}' instance {self.instance.name} is not loaded",
                              Status.UNAVAILABLE)
        padding = self._padding(batch)
        if padding:
            arrays = {name: np.concatenate([array, np.zeros((padding, *array.shape[1:]), array.dtype)])
                      for name, array in arrays.items()}
        try:
            results = self._request.infer(arrays)
        except RuntimeError as error:
            raise ServerError(f"model '{self.model.name}': OpenVINO inference failed: {openvino_message(error)}",
                              Status.INTERNAL) from None
        return {spec.name: results[spec.name][:batch] if padding else results[spec.name]
                for spec in self.model.config.output}

    def _padding(self, batch: int) -> int:
        """Rows of zeros to add so a batch fills a fixed batch size (SKIP_OV_DYNAMIC_BATCHSIZE)."""
        fixed = self.model.config.max_batch_size
        if fixed <= 0 or not self.parameters.skip_dynamic_batch or batch == fixed:
            return 0
        if not self.parameters.enable_batch_padding:
            raise ServerError(f"model '{self.model.name}' runs at a fixed batch size of {fixed} "
                              f"(SKIP_OV_DYNAMIC_BATCHSIZE), got a batch of {batch}; send batches of {fixed} "
                              "or set the parameter ENABLE_BATCH_PADDING to YES")
        return fixed - batch

    async def unload(self) -> None:
        self._request = None
        self.compiled = None
