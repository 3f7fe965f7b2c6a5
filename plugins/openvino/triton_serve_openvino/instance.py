"""An OpenVINO model version and its instances: each compiles the model for the CPU and runs one InferRequest."""
from __future__ import annotations

import numpy as np
import openvino as ov

from triton_serve.plugin import (Backend, FrameworkInstance, InstanceSpec, Model, ModelInstance, ModelSpec, ServerError,
                                 Status)

from .model_file import new_core, openvino_message, read_model
from .parameters import OpenVinoParameters
from .preparation import prepare_model


class OpenVinoModel(Model):
    """One version of an OpenVINO model; it refuses instances that are not KIND_CPU."""

    def __init__(self, backend: Backend, spec: ModelSpec) -> None:
        super().__init__(backend, spec)
        self.parameters: OpenVinoParameters = spec.parameters

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        if instance.kind != "CPU":
            raise ServerError(f"model '{self.spec.name}': instance group '{instance.group.name}' has kind "
                              f"KIND_{instance.kind}, but the openvino backend runs models on the CPU only; "
                              "use kind: KIND_CPU")
        return OpenVinoInstance(self, instance)


class OpenVinoInstance(FrameworkInstance):
    """Reads, fits and compiles the model with its own ``ov.Core`` when it opens; each batch runs as one
    inference of its InferRequest (OpenVINO releases the GIL while it infers)."""

    model: OpenVinoModel
    compiled: ov.CompiledModel
    _request: ov.InferRequest

    def open(self) -> None:
        parameters, name = self.model.parameters, self.model.spec.name
        core = new_core(parameters, name)
        model = prepare_model(read_model(core, self.model.spec), self.model.spec.config, parameters, name)
        try:
            self.compiled = core.compile_model(model, "CPU", parameters.compile_properties)
        except RuntimeError as error:
            properties = ", ".join(f"{k}={v}" for k, v in parameters.compile_properties.items()) or "defaults"
            raise ServerError(f"model '{name}': OpenVINO cannot compile it for the CPU ({properties}): "
                              f"{openvino_message(error)}") from None
        self._request = self.compiled.create_infer_request()

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        config = self.model.spec.config
        padding = self._padding(inputs)
        if padding:
            inputs = {name: np.concatenate([array, np.zeros((padding, *array.shape[1:]), array.dtype)])
                      for name, array in inputs.items()}
        try:
            results = self._request.infer(inputs)
        except RuntimeError as error:
            raise ServerError(f"model '{self.model.spec.name}': OpenVINO inference failed: "
                              f"{openvino_message(error)}", Status.INTERNAL) from None
        rows = config.max_batch_size - padding
        return {spec.name: results[spec.name][:rows] if padding else results[spec.name] for spec in config.output}

    def close(self) -> None:
        del self._request, self.compiled

    def _padding(self, inputs: dict[str, np.ndarray]) -> int:
        """Rows of zeros to add so a batch fills a fixed batch size (SKIP_OV_DYNAMIC_BATCHSIZE)."""
        fixed = self.model.spec.config.max_batch_size
        if fixed <= 0 or not self.model.parameters.skip_dynamic_batch or not inputs:
            return 0
        batch = len(next(iter(inputs.values())))
        if batch == fixed:
            return 0
        if not self.model.parameters.enable_batch_padding:
            raise ServerError(f"model '{self.model.spec.name}' runs at a fixed batch size of {fixed} "
                              f"(SKIP_OV_DYNAMIC_BATCHSIZE), got a batch of {batch}; send batches of {fixed} "
                              "or set the parameter ENABLE_BATCH_PADDING to YES")
        return fixed - batch
