"""Fixtures for the batching tests: a probe backend that reports how it was batched."""
from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triton_serve.plugin import (
    Backend, BackendRegistry, InferenceRequest, InferenceResponse, InstanceSpec, ModelInstance, ModelSpec, Tensor,
    hookimpl,
)
from triton_serve.testing import RunningServer


class _ProbeInstance(ModelInstance):
    def __init__(self, counter: itertools.count) -> None:
        self.counter = counter

    async def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse]:
        """Sleep for the largest INPUT0 value (seconds), then answer each row with INPUT0, the
        execution's number (1, 2... per model) and the execution's total batch size."""
        delay = max(float(r.inputs["INPUT0"].data.max()) for r in requests)
        execution = next(self.counter)
        if delay > 0:
            await asyncio.sleep(delay)
        total = sum(r.inputs["INPUT0"].shape[0] for r in requests)
        responses = []
        for request in requests:
            data = request.inputs["INPUT0"].data
            rows = data.shape[0]
            responses.append(InferenceResponse([
                Tensor("OUTPUT0", "FP32", data.shape, data),
                Tensor("EXECUTION", "INT64", (rows, 1), np.full((rows, 1), execution, np.int64)),
                Tensor("BATCH", "INT64", (rows, 1), np.full((rows, 1), total, np.int64)),
            ]))
        return responses


class ProbeBackend(Backend):
    """Backend ``probe``: see _ProbeInstance.execute. Executions are counted per model version."""

    name = "probe"

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.counters: dict[Path, itertools.count] = {}

    def create_instance(self, model: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        counter = self.counters.setdefault(model.version_dir, itertools.count(1))
        return _ProbeInstance(counter)


class ProbePlugin:
    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(ProbeBackend)


PROBE = """
backend: "probe"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: {ragged} }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "EXECUTION" data_type: TYPE_INT64 dims: [ 1 ] }},
         {{ name: "BATCH" data_type: TYPE_INT64 dims: [ 1 ] }} ]
"""


@pytest.fixture
def serve_probe(tserve, tmp_path: Path) -> Callable[..., RunningServer]:  # type: ignore[no-untyped-def]
    """``serve_probe(extra_config, max_batch_size=8, name="probe", ragged=False, **server_options)``:
    serve one probe model whose config is PROBE plus ``extra_config``."""
    def start(extra_config: str = "", *, max_batch_size: int = 8, name: str = "probe", ragged: bool = False,
              **options: Any) -> RunningServer:
        model_dir = tmp_path / "models" / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(PROBE.format(max_batch_size=max_batch_size, ragged=str(ragged).lower()) + extra_config)
        return tserve(tmp_path / "models", extra_plugins=[("probe", ProbePlugin())], **options)
    return start
