"""Running one batch through an ONNX Runtime session: inputs converted for ONNX Runtime, outputs as numpy."""
from __future__ import annotations

from typing import Any

import numpy as np

from triton_serve.plugin import ModelConfig, ServerError, Status

from .signature import ModelSignature
from .tensors import bf16_input, ortvalue_as_array, text_input

STRING = "tensor(string)"
BFLOAT16 = "tensor(bfloat16)"


class SessionRunner:
    """An ONNX Runtime session and what running it needs. ``run`` blocks: call it in a worker thread
    (ONNX Runtime releases the GIL while it computes), one call at a time."""

    def __init__(self, session: Any, signature: ModelSignature, config: ModelConfig, model_name: str,
                 run_options: Any) -> None:
        self.session = session
        self.model_name = model_name
        self.run_options = run_options
        self.output_names = [spec.name for spec in config.output]
        inputs = {**signature.initializers, **signature.inputs}
        self._text_inputs = {name for name, info in inputs.items() if info.ort_type == STRING}
        self._bf16_inputs = {name for name, info in inputs.items() if info.ort_type == BFLOAT16}
        # a scalar model input is [1] in a non-batching config (Triton's autofill); ONNX Runtime wants rank 0
        self._scalar_inputs = set() if config.max_batch_size > 0 else {n for n, i in inputs.items() if not i.dims}
        # numpy has no bfloat16, so BF16 outputs are read from OrtValues, which cannot hold strings
        self._ortvalue_outputs = any(signature.outputs[name].ort_type == BFLOAT16 for name in self.output_names)
        if self._ortvalue_outputs and self._text_inputs & {spec.name for spec in config.input}:
            raise ServerError(f"model '{model_name}': ONNX Runtime's Python API cannot run a model with BF16 "
                              "outputs and string inputs together", Status.UNSUPPORTED)

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the config's outputs for a batch of inputs (name -> array, as ``concat_inputs`` gives them)."""
        from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

        feed = {name: self._converted(name, array) for name, array in arrays.items()}
        try:
            if self._ortvalue_outputs:
                values = self.session.run_with_ort_values(self.output_names, self._as_ortvalues(feed),
                                                          self.run_options)
                results = [ortvalue_as_array(value) for value in values]
            else:
                results = self.session.run(self.output_names, feed, self.run_options)
        except InvalidArgument as error:
            raise ServerError(f"ONNX Runtime rejected the inputs of model '{self.model_name}': {error}") from None
        except Exception as error:  # ONNX Runtime's errors share no base class beyond Exception
            raise ServerError(f"ONNX Runtime failed to run model '{self.model_name}': {error}",
                              Status.INTERNAL) from None
        return {name: result.reshape(1) if result.ndim == 0 else result
                for name, result in zip(self.output_names, results, strict=True)}

    def _converted(self, name: str, array: np.ndarray) -> Any:
        if name in self._scalar_inputs:
            array = array.reshape(())
        if name in self._text_inputs:
            return text_input(array, name, self.model_name)
        if name in self._bf16_inputs:
            return bf16_input(array)
        return array

    @staticmethod
    def _as_ortvalues(feed: dict[str, Any]) -> dict[str, Any]:
        import onnxruntime

        return {name: value if isinstance(value, onnxruntime.OrtValue)
                else onnxruntime.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))
                for name, value in feed.items()}
