"""The sequence batcher's control inputs: START, END, READY and CORRID, as the config asks for them."""
from __future__ import annotations

import numpy as np

from triton_serve.plugin import (InferenceRequest, ModelConfig, ModelSequenceBatching, Tensor, TensorType,
                                 datatype_of_config)

Control = ModelSequenceBatching.Control
_FLAG_TYPES = {"INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_}


class SequenceControls:
    """The control input tensors (START, END, READY, CORRID) that ``sequence_batching.control_input``
    asks for, shaped ``[1]`` (``[1, 1]`` when the model batches)."""

    def __init__(self, config: ModelConfig) -> None:
        self._shape = (1, 1) if config.max_batch_size > 0 else (1,)
        # name, kind, datatype, (false value, true value)
        self._flags: list[tuple[str, Control.Kind, str, tuple[float, ...]]] = []
        self.corrid_input: tuple[str, TensorType] | None = None  # the CORRID input's name and type
        for control_input in config.sequence_batching.control_input:
            for control in control_input.control:
                if control.kind == Control.CONTROL_SEQUENCE_CORRID:
                    self.corrid_input = (control_input.name, datatype_of_config(control.data_type))
                elif control.int32_false_true:
                    self._flags.append((control_input.name, control.kind, "INT32", tuple(control.int32_false_true)))
                elif control.fp32_false_true:
                    self._flags.append((control_input.name, control.kind, "FP32", tuple(control.fp32_false_true)))
                else:
                    self._flags.append((control_input.name, control.kind, "BOOL", tuple(control.bool_false_true)))

    def tensors(self, request: InferenceRequest) -> list[Tensor]:
        """The control tensors for ``request``; READY is always true (no filler requests are sent)."""
        tensors = []
        for name, kind, datatype, false_true in self._flags:
            on = {Control.CONTROL_SEQUENCE_START: request.sequence_start,
                  Control.CONTROL_SEQUENCE_END: request.sequence_end}.get(kind, True)
            tensors.append(Tensor(name, datatype, self._shape,
                                  np.full(self._shape, false_true[on], dtype=_FLAG_TYPES[datatype])))
        if self.corrid_input is not None:
            name, corrid_type = self.corrid_input
            corrid = request.sequence_id
            if corrid_type.name == "BYTES":
                data = np.full(self._shape, str(corrid).encode(), dtype=np.object_)
            else:  # 32-bit types take the id's low bits, as Triton's do
                data = np.full(self._shape, corrid, dtype=np.uint64).astype(corrid_type.numpy)
            tensors.append(Tensor(name, corrid_type.name, self._shape, data))
        return tensors
