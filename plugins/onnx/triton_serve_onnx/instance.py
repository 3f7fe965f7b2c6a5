"""One instance of an ONNX model: its own ONNX Runtime session, created at load and run in a worker thread."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from triton_serve.plugin import (InferenceRequest, InferenceResponse, InstanceSpec, ModelInstance, ModelSpec,
                                 concat_inputs, split_outputs)

from .runner import SessionRunner
from .session import open_instance_session


class OnnxRuntimeInstance(ModelInstance):
    """Runs batches of requests through one ONNX Runtime session on the instance's device.

    ``load`` opens the session in a worker thread (CPU, or CUDA on ``device_id`` for KIND_GPU, plus the
    config's execution accelerators) and checks the config against the model; ``execute`` concatenates the
    requests along the batch dimension, runs the session in a worker thread and splits the outputs.
    """

    def __init__(self, model: ModelSpec, instance: InstanceSpec) -> None:
        self.model = model
        self.instance = instance
        self.runner: SessionRunner | None = None

    async def load(self) -> None:
        self.runner = await asyncio.to_thread(open_instance_session, self.model, self.instance)

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse]:
        assert self.runner is not None, "execute called before load"
        arrays = concat_inputs(requests, self.model.config)
        outputs = await asyncio.to_thread(self.runner.run, arrays)
        return split_outputs(outputs, requests, self.model.config)

    async def unload(self) -> None:
        self.runner = None
