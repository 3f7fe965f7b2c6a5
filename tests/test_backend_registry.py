"""The server makes one object per backend, also when many models of that backend load at once."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import tritonclient.http as httpclient

from triton_serve.plugin import BackendRegistry, hookimpl
from triton_serve.testing import TOY_BACKENDS

from .conftest import write_model

MODELS = 8


class SlowStartBackend(TOY_BACKENDS[0]):  # type: ignore[misc,valid-type]
    """toy_identity under another name, whose constructor takes as long as importing a framework."""

    name = "slow_start"
    platforms = ()
    made: list[int] = []

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.made.append(1)
        time.sleep(0.2)  # every concurrent load asks for the backend while this one is being made


class SlowStartPlugin:
    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(SlowStartBackend)


def test_parallel_loads_make_one_backend(tmp_path: Path, tserve) -> None:  # type: ignore[no-untyped-def]
    config = ('backend: "slow_start"\nmax_batch_size: 0\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }]\n')
    for index in range(MODELS):
        write_model(tmp_path, f"identity_{index}", config)
    SlowStartBackend.made.clear()
    server = tserve(tmp_path, extra_plugins=[("slow_start", SlowStartPlugin())])  # loads the models at once
    client = httpclient.InferenceServerClient(server.http_url)
    assert all(client.is_model_ready(f"identity_{index}") for index in range(MODELS))
    assert len(SlowStartBackend.made) == 1
