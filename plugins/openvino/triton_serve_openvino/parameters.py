"""Triton's OpenVINO backend parameters, read from a model config's ``parameters`` and checked."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from triton_serve.plugin import ModelConfig, ServerError

_YES, _NO = "YES", "NO"


@dataclass(frozen=True)
class OpenVinoParameters:
    """How to compile and batch one model.

    ``compile_properties`` holds OpenVINO CPU properties by their OpenVINO names (``NUM_STREAMS``,
    ``PERFORMANCE_HINT``, ``INFERENCE_NUM_THREADS``, ``COMPILATION_NUM_THREADS``,
    ``INFERENCE_PRECISION_HINT``); the flags are Triton's batching and reshape switches.
    """

    compile_properties: dict[str, str] = field(default_factory=dict)
    cpu_extension_path: str = ""
    skip_dynamic_batch: bool = False  # SKIP_OV_DYNAMIC_BATCHSIZE: keep the batch fixed at max_batch_size
    enable_batch_padding: bool = False  # ENABLE_BATCH_PADDING: pad smaller batches up to that fixed size
    reshape_io_layers: bool = False  # RESHAPE_IO_LAYERS: reshape the model's inputs to the config's dims

    @classmethod
    def from_config(cls, config: ModelConfig, model_name: str) -> OpenVinoParameters:
        """Parse the parameters Triton's OpenVINO backend knows; other keys are left to others.
        A bad value raises ServerError naming the model, the parameter and what it accepts."""
        given = {key: value.string_value.strip() for key, value in config.parameters.items()}

        def parsed(key: str, parse: Callable[[str], str]) -> str | None:
            if key not in given:
                return None
            try:
                return parse(given[key])
            except ValueError as error:
                raise ServerError(f"model '{model_name}': parameter {key} {error}, got '{given[key]}'") from None

        properties: dict[str, str] = {}
        for key, ov_key, parse in _COMPILE_PARAMETERS:
            value = parsed(key, parse)
            if value is not None:
                properties[ov_key] = value
        return cls(
            compile_properties=properties,
            cpu_extension_path=given.get("CPU_EXTENSION_PATH", ""),
            skip_dynamic_batch=parsed("SKIP_OV_DYNAMIC_BATCHSIZE", _yes_no) == _YES,
            enable_batch_padding=parsed("ENABLE_BATCH_PADDING", _yes_no) == _YES,
            reshape_io_layers=parsed("RESHAPE_IO_LAYERS", _yes_no) == _YES,
        )


def _count(text: str) -> str:
    if not text.isdigit():
        raise ValueError("must be a non-negative integer")
    return str(int(text))


def _streams(text: str) -> str:
    if text.upper() in ("AUTO", "NUMA"):
        return text.upper()
    if not text.isdigit():
        raise ValueError("must be AUTO, NUMA or a non-negative integer")
    return str(int(text))


def _performance_hint(text: str) -> str:
    if text.upper() not in ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"):
        raise ValueError("must be LATENCY, THROUGHPUT or CUMULATIVE_THROUGHPUT")
    return text.upper()


def _bf16_precision(text: str) -> str:
    return "bf16" if _yes_no(text) == _YES else "f32"


def _yes_no(text: str) -> str:
    if text.upper() not in (_YES, _NO):
        raise ValueError("must be YES or NO")
    return text.upper()


# Triton parameter -> OpenVINO property, and how its value is checked and spelled.
_COMPILE_PARAMETERS: tuple[tuple[str, str, Callable[[str], str]], ...] = (
    ("PERFORMANCE_HINT", "PERFORMANCE_HINT", _performance_hint),
    ("NUM_STREAMS", "NUM_STREAMS", _streams),
    ("INFERENCE_NUM_THREADS", "INFERENCE_NUM_THREADS", _count),
    ("COMPILATION_NUM_THREADS", "COMPILATION_NUM_THREADS", _count),
    ("HINT_BF16", "INFERENCE_PRECISION_HINT", _bf16_precision),
)


def default_max_batch_size(options: Mapping[str, str]) -> int:
    """``--backend-config=openvino,default-max-batch-size=N`` (Triton's name; 4 by default, as in Triton)."""
    text = options.get("default-max-batch-size", "4").strip()
    if not text.isdigit() or int(text) < 1:
        raise ServerError(f"--backend-config=openvino: default-max-batch-size must be a positive integer, "
                          f"got '{text}'")
    return int(text)
