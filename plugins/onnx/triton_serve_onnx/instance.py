"""An ONNX model version and its instances: one ONNX Runtime session per instance, opened and run on the
instance's thread."""
from __future__ import annotations

import numpy as np

from triton_serve.plugin import FrameworkInstance, InstanceSpec, Model, ModelInstance

from .runner import SessionRunner
from .session import open_instance_session


class OnnxRuntimeModel(Model):
    """One version of an ONNX model; each of its instances opens a session of its own."""

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return OnnxRuntimeInstance(self, instance)


class OnnxRuntimeInstance(FrameworkInstance):
    """One ONNX Runtime session on the instance's device: the CPU, or CUDA on ``device_id`` for KIND_GPU,
    plus the config's execution accelerators; ``open`` checks the config against the model."""

    runner: SessionRunner

    def open(self) -> None:
        self.runner = open_instance_session(self.model.spec, self.spec)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.run(inputs)

    def close(self) -> None:
        del self.runner
