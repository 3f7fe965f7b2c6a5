"""Fixtures for the TensorRT backend tests: engine descriptions written as plain data, and model repositories."""
from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from triton_serve.plugin import ModelConfig
from triton_serve_tensorrt.engine_description import EngineDescription, ProfileShapes, TensorDescription

TENSORRT_MISSING = "TensorRT is not installable in this workplace"


class EngineKit:
    """Builds the engine descriptions the tests use (reached through the ``kit`` fixture)."""

    @staticmethod
    def tensor(name: str, shape: tuple[int, ...], *, output: bool = False, trt_type: str = "FLOAT",
               profiles: tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...] = (),
               shape_tensor: bool = False) -> TensorDescription:
        ranges = tuple(ProfileShapes(*p) for p in profiles)
        if not output and not shape_tensor and not ranges:
            ranges = (ProfileShapes(shape, shape, shape),)
        return TensorDescription(name, not output, trt_type, shape, shape_tensor, ranges)

    @classmethod
    def linear(cls, *profiles: tuple[int, int, int]) -> EngineDescription:
        """INPUT0 FP32 [-1, 4] -> OUTPUT0 FP32 [-1, 3]; one profile per (min, opt, max) batch size."""
        batches = profiles or ((1, 4, 8),)
        ranges = tuple(((lo, 4), (opt, 4), (hi, 4)) for lo, opt, hi in batches)
        return EngineDescription((cls.tensor("INPUT0", (-1, 4), profiles=ranges),
                                  cls.tensor("OUTPUT0", (-1, 3), output=True)), len(ranges))

    @classmethod
    def static(cls) -> EngineDescription:
        """INPUT0 FP32 [2, 4] -> OUTPUT0 FP32 [2, 3]: no dynamic dimension, so no batching."""
        return EngineDescription((cls.tensor("INPUT0", (2, 4)), cls.tensor("OUTPUT0", (2, 3), output=True)))

    @staticmethod
    def config(text: str = "", name: str = "m") -> ModelConfig:
        return text_format.Parse(f'name: "{name}"\nplatform: "tensorrt_plan"\n{text}', ModelConfig())


@pytest.fixture(scope="session")
def kit() -> type[EngineKit]:
    return EngineKit


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    return root
