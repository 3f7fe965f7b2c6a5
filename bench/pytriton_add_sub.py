"""The function bench/run_pytriton.py serves, bound through PyTriton 0.7.0 or triton-serve-pytriton.

``BENCH_PYTRITON_IMPL=pytriton`` imports ``pytriton`` (run it with an interpreter that has
nvidia-pytriton 0.7.0); anything else imports ``triton_serve_pytriton``. Ports come from PyTriton's
``PYTRITON_TRITON_CONFIG_*`` environment variables, which both read.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

if os.environ.get("BENCH_PYTRITON_IMPL") == "pytriton":
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton
else:
    from triton_serve_pytriton.decorators import batch  # type: ignore[no-redef]
    from triton_serve_pytriton.model_config import DynamicBatcher, ModelConfig, Tensor  # type: ignore[no-redef]
    from triton_serve_pytriton.triton import Triton  # type: ignore[no-redef]

MODEL = "AddSub"


@batch
def add_sub(INPUT_1: np.ndarray, INPUT_2: np.ndarray) -> dict[str, np.ndarray]:  # noqa: N803
    return {"add": INPUT_1 + INPUT_2, "sub": INPUT_1 - INPUT_2}


def bind(triton: Any) -> None:
    """Bind ``add_sub`` as PyTriton's add_sub example does (FP32 vectors, batching up to 128)."""
    triton.bind(model_name=MODEL, infer_func=add_sub,
                inputs=[Tensor(dtype=np.float32, shape=(-1,)), Tensor(dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="add", dtype=np.float32, shape=(-1,)),
                         Tensor(name="sub", dtype=np.float32, shape=(-1,))],
                config=ModelConfig(max_batch_size=128, batcher=DynamicBatcher()))


if __name__ == "__main__":
    with Triton() as triton:
        bind(triton)
        triton.serve()
