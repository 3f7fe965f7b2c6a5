"""Auto-complete: fill the max_batch_size, inputs and outputs a config leaves out from the ONNX model, as
Triton's onnxruntime backend does."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from triton_serve.plugin import ModelConfig, ModelInput, ModelOutput, ServerError

from .signature import ModelSignature, TensorInfo
from .tensors import unsupported_type

T = TypeVar("T", ModelInput, ModelOutput)


def needs_completion(config: ModelConfig) -> bool:
    """As in Triton, a config that lists both inputs and outputs is not completed."""
    return not ((config.input or config.batch_input) and config.output)


def auto_complete(config: ModelConfig, signature: ModelSignature, model_name: str,
                  default_max_batch_size: int) -> None:
    """Complete ``config`` in place (when ``needs_completion``).

    When every model input and output has a variable first dimension, a max_batch_size of 0 becomes
    ``default_max_batch_size`` (that dimension then leaves the dims; the server then adds the dynamic
    batcher, as Triton does). Symbolic and unknown dimensions become -1.
    """
    _complete_max_batch_size(config, signature, model_name, default_max_batch_size)
    if not (config.input or config.batch_input):
        config.input.extend(_entries(ModelInput, signature.inputs.values(), "input", config.max_batch_size,
                                     model_name))
    if not config.output:
        config.output.extend(_entries(ModelOutput, signature.outputs.values(), "output", config.max_batch_size,
                                      model_name))


def _complete_max_batch_size(config: ModelConfig, signature: ModelSignature, model_name: str,
                             default_max_batch_size: int) -> None:
    if not signature.supports_batching:
        if config.max_batch_size != 0:
            raise ServerError(f"autofill failed for model '{model_name}': model does not support batching while "
                              f"non-zero max_batch_size ({config.max_batch_size}) is specified (every ONNX input "
                              "and output needs a variable first dimension to batch)")
        return
    if config.max_batch_size == 0:
        config.max_batch_size = max(default_max_batch_size, 0)


def _entries(message: type[T], infos: Iterable[TensorInfo], kind: str, max_batch_size: int,
             model_name: str) -> list[T]:
    entries = []
    for info in infos:
        if info.data_type is None:
            raise unsupported_type(kind, info.name, info.ort_type, model_name)
        dims = info.dims[1:] if max_batch_size > 0 else info.dims
        entry = message(name=info.name, data_type=info.data_type, dims=list(dims) or [1])
        if not dims and max_batch_size > 0:
            entry.reshape.SetInParent()  # a model tensor of shape [batch] travels as [batch, 1]
        entries.append(entry)
    return entries
