"""Triton's OpenVINO backend parameters, declared for the core's parser."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from triton_serve.plugin import option

YesNo = Literal["YES", "NO"]


def _streams(text: str) -> None:
    if text.upper() not in ("AUTO", "NUMA") and not text.isdigit():
        raise ValueError("expected AUTO, NUMA or an integer >= 0")


@dataclass(frozen=True)
class OpenVinoParameters:
    """A model's ``parameters`` that Triton's OpenVINO backend reads, by Triton's keys (any case for the
    words); ``None``: not set, OpenVINO's own default applies."""

    performance_hint: Literal["LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"] | None = option(
        None, key="PERFORMANCE_HINT", doc="OpenVINO's PERFORMANCE_HINT")
    num_streams: str | None = option(None, key="NUM_STREAMS", check=_streams,
                                     doc="OpenVINO's NUM_STREAMS: AUTO, NUMA or a number")
    inference_num_threads: int | None = option(None, key="INFERENCE_NUM_THREADS", minimum=0,
                                               doc="OpenVINO's INFERENCE_NUM_THREADS")
    compilation_num_threads: int | None = option(None, key="COMPILATION_NUM_THREADS", minimum=0,
                                                 doc="OpenVINO's COMPILATION_NUM_THREADS")
    hint_bf16: YesNo | None = option(None, key="HINT_BF16",
                                     doc="INFERENCE_PRECISION_HINT bf16 (YES) or f32 (NO); unset: OpenVINO chooses")
    cpu_extension_path: str = option("", key="CPU_EXTENSION_PATH", doc="a library of custom operations to load")
    skip_dynamic_batchsize: YesNo = option("NO", key="SKIP_OV_DYNAMIC_BATCHSIZE",
                                           doc="YES keeps the batch fixed at max_batch_size")
    batch_padding: YesNo = option("NO", key="ENABLE_BATCH_PADDING",
                                  doc="YES pads smaller batches up to that fixed size")
    io_layer_reshape: YesNo = option("NO", key="RESHAPE_IO_LAYERS",
                                     doc="YES reshapes the model's inputs to the config's dims")

    @property
    def compile_properties(self) -> dict[str, str]:
        """The OpenVINO CPU properties to compile with, by their OpenVINO names."""
        properties = {"PERFORMANCE_HINT": self.performance_hint,
                      "NUM_STREAMS": None if self.num_streams is None else
                      self.num_streams.upper() if not self.num_streams.isdigit() else str(int(self.num_streams)),
                      "INFERENCE_NUM_THREADS": self.inference_num_threads,
                      "COMPILATION_NUM_THREADS": self.compilation_num_threads,
                      "INFERENCE_PRECISION_HINT": None if self.hint_bf16 is None else
                      "bf16" if self.hint_bf16 == "YES" else "f32"}
        return {key: str(value) for key, value in properties.items() if value is not None}

    @property
    def skip_dynamic_batch(self) -> bool:
        """SKIP_OV_DYNAMIC_BATCHSIZE: keep the batch fixed at max_batch_size."""
        return self.skip_dynamic_batchsize == "YES"

    @property
    def enable_batch_padding(self) -> bool:
        """ENABLE_BATCH_PADDING: pad smaller batches up to the fixed size."""
        return self.batch_padding == "YES"

    @property
    def reshape_io_layers(self) -> bool:
        """RESHAPE_IO_LAYERS: reshape the model's inputs to the config's dims."""
        return self.io_layer_reshape == "YES"
