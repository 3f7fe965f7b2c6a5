"""FIL's tensors in a model config: filled in from the model file, and checked against it."""
from __future__ import annotations

from typing import TYPE_CHECKING

from triton_serve.plugin import DataType, ModelConfig, ServerError, Status

from .outputs import OutputRule

if TYPE_CHECKING:
    from .forest import Forest

INPUT_NAME = "input__0"
OUTPUT_NAME = "output__0"


def complete_config(config: ModelConfig, forest: Forest, rule: OutputRule, default_max_batch_size: int) -> None:
    """Add ``input__0`` [num_feature], ``output__0`` [width] and ``max_batch_size`` where the config has none."""
    if not config.input:
        config.input.add(name=INPUT_NAME, data_type=DataType.TYPE_FP32, dims=[forest.num_feature])
    if not config.output:
        config.output.add(name=OUTPUT_NAME, data_type=DataType.TYPE_FP32, dims=[rule.widths()[0]])
    if config.max_batch_size == 0:
        config.max_batch_size = default_max_batch_size


def check_config(config: ModelConfig, forest: Forest, rule: OutputRule) -> int:
    """Raise a ServerError where the config contradicts the model; return ``output__0``'s width."""
    if config.max_batch_size <= 0:
        raise ServerError("max_batch_size must be > 0: FIL models take a batch of rows")
    names = [tensor.name for tensor in config.input]
    if names != [INPUT_NAME]:
        raise ServerError(f"FIL models take one input named '{INPUT_NAME}'; the config declares {names}")
    _check_fp32(config.input[0].data_type, "input", INPUT_NAME)
    dims = list(config.input[0].dims)
    if dims not in ([forest.num_feature], [-1]):
        raise ServerError(f"input '{INPUT_NAME}' has dims {dims}, but the model reads {forest.num_feature} "
                          f"features: use dims [{forest.num_feature}]")
    outputs = {tensor.name: tensor for tensor in config.output}
    others = sorted(set(outputs) - {OUTPUT_NAME})
    if others:
        raise ServerError(f"output(s) {others} are not supported by this fil backend (it fills only "
                          f"'{OUTPUT_NAME}'; TreeSHAP output is not implemented)", Status.UNSUPPORTED)
    if OUTPUT_NAME not in outputs:
        raise ServerError(f"FIL models have one output named '{OUTPUT_NAME}'; the config declares none")
    output = outputs[OUTPUT_NAME]
    _check_fp32(output.data_type, "output", OUTPUT_NAME)
    widths = rule.widths()
    dims = list(output.dims)
    if dims == [-1]:
        return widths[0]
    if len(dims) != 1 or dims[0] not in widths:
        expected = " or ".join(f"[{width}]" for width in widths)
        raise ServerError(f"output '{OUTPUT_NAME}' has dims {dims}, but this model writes {expected} "
                          f"({_describe(rule)})")
    return dims[0]


def _check_fp32(data_type: int, kind: str, name: str) -> None:
    if data_type != DataType.TYPE_FP32:
        raise ServerError(f"{kind} '{name}' has data_type {DataType.Name(data_type)}; FIL models use TYPE_FP32")


def _describe(rule: OutputRule) -> str:
    if not rule.is_classifier:
        return f"{rule.num_scores} score(s) per row, output_class false"
    if not rule.predict_proba:
        return "one class index per row, output_class true and predict_proba false"
    if rule.num_scores == 1:
        return "a binary classifier's probabilities, predict_proba true"
    return f"{rule.num_scores} class probabilities per row, predict_proba true"
