"""An ONNX model's inputs and outputs as ONNX Runtime reports them: names, config datatypes and dims."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .tensors import CONFIG_TYPE_OF_ORT


@dataclass(frozen=True)
class TensorInfo:
    """One model input or output. ``data_type`` is a ModelConfig name ("TYPE_FP32"), or None when the ONNX
    type (``ort_type``) has no Triton datatype; ``dims`` holds -1 for symbolic or unknown dimensions."""

    name: str
    ort_type: str
    data_type: str | None
    dims: tuple[int, ...]


@dataclass(frozen=True)
class ModelSignature:
    """The tensors a session takes and returns. ``initializers`` are overridable initializers: weights
    a request may replace, so a config may list them as (optional) inputs."""

    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]
    initializers: dict[str, TensorInfo]

    @property
    def supports_batching(self) -> bool:
        """Whether every input and output has a variable first dimension (Triton's autofill rule)."""
        tensors = [*self.inputs.values(), *self.outputs.values()]
        return all(tensor.dims and tensor.dims[0] == -1 for tensor in tensors)


def read_signature(session: Any) -> ModelSignature:
    """The signature of an ``onnxruntime.InferenceSession``."""
    return ModelSignature(_infos(session.get_inputs()), _infos(session.get_outputs()),
                          _infos(session.get_overridable_initializers()))


def _infos(node_args: Any) -> dict[str, TensorInfo]:
    return {arg.name: TensorInfo(arg.name, arg.type, CONFIG_TYPE_OF_ORT.get(arg.type), _dims(arg.shape))
            for arg in node_args}


def _dims(shape: Any) -> tuple[int, ...]:
    if shape is None:
        return ()
    return tuple(dim if isinstance(dim, int) and dim >= 0 else -1 for dim in shape)
