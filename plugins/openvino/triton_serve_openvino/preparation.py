"""Fit an OpenVINO model to its config: check the tensors, set the batch dimension, convert element types."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import openvino as ov
from openvino.preprocess import PrePostProcessor

from triton_serve.plugin import DataType, ModelConfig, ModelInput, ModelOutput, ServerError

from .datatypes import SERVED, element_type_of
from .model_file import openvino_message
from .parameters import OpenVinoParameters

Tensor = ModelInput | ModelOutput
TensorT = TypeVar("TensorT", ModelInput, ModelOutput)


def prepare_model(model: ov.Model, config: ModelConfig, parameters: OpenVinoParameters, model_name: str) -> ov.Model:
    """``model`` reshaped and converted to serve ``config``, as Triton's OpenVINO backend does.

    Every model input must be listed in the config and every listed tensor must be in the model, with
    the same rank and compatible dimensions (``reshape.shape`` stands for ``dims`` where given). With
    ``max_batch_size > 0`` the inputs' first dimension becomes dynamic, or fixed at max_batch_size with
    SKIP_OV_DYNAMIC_BATCHSIZE; RESHAPE_IO_LAYERS reshapes the inputs to the config's dims. A config
    data_type other than the model's is converted by OpenVINO. Raises ServerError naming the tensor and field.
    """
    fitter = _Fitter(config, parameters, model_name)
    inputs = fitter.match(model.inputs, config.input, "input")
    fitter.check_all_inputs_listed(model.inputs, config.input)
    reshapes = {spec.name: fitter.input_shape(spec, port.get_partial_shape()) for spec, port in inputs}
    changed = {name: shape for name, shape in reshapes.items()
               if shape != model.input(name).get_partial_shape()}
    if changed:
        fitter.reshape(model, changed)
    outputs = fitter.match(model.outputs, config.output, "output")
    for spec, port in outputs:
        fitter.check_output_shape(spec, port.get_partial_shape())
    return fitter.convert_types(model, inputs, outputs)


class _Fitter:
    def __init__(self, config: ModelConfig, parameters: OpenVinoParameters, model_name: str) -> None:
        self.parameters = parameters
        self.model_name = model_name
        self.max_batch_size = config.max_batch_size

    def fail(self, kind: str, spec_name: str, field: str, problem: str) -> ServerError:
        return ServerError(f"model '{self.model_name}': {kind} '{spec_name}' {field}: {problem}")

    def match(self, ports: Sequence[ov.Output], specs: Sequence[TensorT],
              kind: str) -> list[tuple[TensorT, ov.Output]]:
        by_name = {name: port for port in ports for name in port.get_names()}
        matched = []
        for spec in specs:
            port = by_name.get(spec.name)
            if port is None:
                known = ", ".join(sorted(by_name)) or "none with a name"
                raise self.fail(kind, spec.name, "name", f"the model file has no {kind} of that name "
                                                         f"(its {kind}s: {known})")
            if element_type_of(spec.data_type) is None:
                raise self.fail(kind, spec.name, "data_type", f"{DataType.Name(spec.data_type)} is not served by "
                                                              f"the openvino backend (it serves {SERVED})")
            matched.append((spec, port))
        return matched

    def check_all_inputs_listed(self, ports: Sequence[ov.Output], specs: Sequence[ModelInput]) -> None:
        listed = {spec.name for spec in specs}
        for port in ports:
            if not listed & port.get_names():
                name = port.get_any_name() if port.get_names() else f"#{port.get_index()}"
                raise ServerError(f"model '{self.model_name}': the model file's input '{name}' is missing from "
                                  "the config's input list; OpenVINO needs every input")

    def input_shape(self, spec: ModelInput, shape: ov.PartialShape) -> ov.PartialShape:
        """The shape the model's input gets: its own, with the batch dimension set and, under
        RESHAPE_IO_LAYERS, the config's dims."""
        dims = _config_dims(spec)
        if shape.rank.is_dynamic:
            model_dims = [ov.Dimension() for _ in dims]
        else:
            self.check_rank("input", spec, shape, dims)
            model_dims = list(shape)[1:] if self.max_batch_size > 0 else list(shape)
        body = []
        for index, (model_dim, dim) in enumerate(zip(model_dims, dims, strict=True)):
            if self.parameters.reshape_io_layers:
                body.append(ov.Dimension(dim) if dim > 0 else ov.Dimension())
                continue
            if dim == -1 and model_dim.is_static:
                raise self.fail("input", spec.name, _dims_field(spec),
                                f"dimension {index} is -1 (variable) in the config but fixed at {model_dim} in the "
                                f"model; use {model_dim}, or set the parameter RESHAPE_IO_LAYERS to YES to make it "
                                "variable")
            self.check_dim("input", spec, index, model_dim, dim)
            body.append(model_dim)
        if self.max_batch_size <= 0:
            return ov.PartialShape(body)
        batch = ov.Dimension(self.max_batch_size) if self.parameters.skip_dynamic_batch else ov.Dimension()
        return ov.PartialShape([batch, *body])

    def check_output_shape(self, spec: ModelOutput, shape: ov.PartialShape) -> None:
        if shape.rank.is_dynamic:
            return
        dims = _config_dims(spec)
        self.check_rank("output", spec, shape, dims)
        model_dims = list(shape)
        if self.max_batch_size > 0:
            batch = model_dims.pop(0)
            expected = ov.Dimension(self.max_batch_size) if self.parameters.skip_dynamic_batch else ov.Dimension()
            if not (batch.is_dynamic or batch == expected):
                raise self.fail("output", spec.name, "dims", f"the model's output has shape {shape}, whose first "
                                "dimension does not follow the batch; set max_batch_size to 0 if the model "
                                "does not batch")
        for index, (model_dim, dim) in enumerate(zip(model_dims, dims, strict=True)):
            self.check_dim("output", spec, index, model_dim, dim)

    def check_rank(self, kind: str, spec: Tensor, shape: ov.PartialShape, dims: list[int]) -> None:
        batching = self.max_batch_size > 0
        if shape.rank.get_length() == len(dims) + batching:
            return
        full = f"[-1 (batch), {', '.join(map(str, dims))}]" if batching else str(dims)
        raise self.fail(kind, spec.name, _dims_field(spec), f"the config gives {len(dims) + batching} dimensions "
                        f"{full}, but the model's {kind} has shape {shape}")

    def check_dim(self, kind: str, spec: Tensor, index: int, model_dim: ov.Dimension, dim: int) -> None:
        if dim != -1 and not model_dim.compatible(ov.Dimension(dim)):
            raise self.fail(kind, spec.name, _dims_field(spec), f"dimension {index} is {dim} in the config but "
                            f"{model_dim} in the model")

    def reshape(self, model: ov.Model, shapes: dict[str, ov.PartialShape]) -> None:
        try:
            model.reshape(shapes)
        except RuntimeError as error:
            wanted = ", ".join(f"'{name}' to {shape}" for name, shape in shapes.items())
            hint = "" if self.max_batch_size <= 0 or self.parameters.skip_dynamic_batch else \
                "; if the model cannot take a dynamic batch, set the parameter SKIP_OV_DYNAMIC_BATCHSIZE to YES " \
                "to serve it at a fixed batch of max_batch_size"
            raise ServerError(f"model '{self.model_name}': OpenVINO cannot reshape input {wanted}: "
                              f"{openvino_message(error)}{hint}") from None

    def convert_types(self, model: ov.Model, inputs: Sequence[tuple[Tensor, ov.Output]],
                      outputs: Sequence[tuple[Tensor, ov.Output]]) -> ov.Model:
        processor = PrePostProcessor(model)
        converted = False
        for spec, port in inputs:
            if element_type_of(spec.data_type) != port.get_element_type():
                processor.input(spec.name).tensor().set_element_type(element_type_of(spec.data_type))
                converted = True
        for spec, port in outputs:
            if element_type_of(spec.data_type) != port.get_element_type():
                processor.output(spec.name).tensor().set_element_type(element_type_of(spec.data_type))
                converted = True
        if not converted:
            return model
        try:
            return processor.build()
        except RuntimeError as error:
            raise ServerError(f"model '{self.model_name}': OpenVINO cannot convert the model's element types to "
                              f"the config's data_type: {openvino_message(error)}") from None


def _config_dims(spec: Tensor) -> list[int]:
    return list(spec.reshape.shape) if spec.HasField("reshape") else list(spec.dims)


def _dims_field(spec: Tensor) -> str:
    return "reshape.shape" if spec.HasField("reshape") else "dims"
