"""vLLM's CPU worker with ``cpu_lora``'s fix of vLLM's CPU LoRA ops (a worker process; vLLM imports this module by
the name the engine process gives as ``worker_cls``)."""
from __future__ import annotations

from typing import Any

from vllm.v1.worker.cpu_worker import CPUWorker

from .cpu_lora import apply


class FixedCPUWorker(CPUWorker):
    """vLLM's CPU worker, with the LoRA ops fixed in its process before its model is made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        apply()
        super().__init__(*args, **kwargs)
