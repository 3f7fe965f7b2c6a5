"""torch's CPU thread pools, sized from model parameters. torch keeps one intra-op and one inter-op
pool per process, so (as in Triton) the first model that sizes a pool wins and later values are ignored."""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from .options import TorchModelOptions

log = logging.getLogger(__name__)


class ThreadPoolSizes:
    """Applies INTRA_OP_THREAD_COUNT / INTER_OP_THREAD_COUNT once per server (one object per backend)."""

    def __init__(self) -> None:
        self._chosen: dict[str, tuple[int, str]] = {}

    def apply(self, model: str, options: TorchModelOptions) -> None:
        self._size(model, "INTRA_OP_THREAD_COUNT", options.intra_op_thread_count,
                   torch.get_num_threads, torch.set_num_threads)
        self._size(model, "INTER_OP_THREAD_COUNT", options.inter_op_thread_count,
                   torch.get_num_interop_threads, torch.set_num_interop_threads)

    def _size(self, model: str, key: str, count: int, current: Callable[[], int],
              resize: Callable[[int], None]) -> None:
        if count == 0:
            return
        if key in self._chosen:
            first, owner = self._chosen[key]
            if first != count:
                log.warning("pytorch model '%s': %s=%d is ignored: model '%s' set it to %d first, and torch's "
                            "thread pools are process-wide", model, key, count, owner, first)
            return
        self._chosen[key] = (count, model)
        if current() == count:
            return
        try:
            resize(count)
        except RuntimeError as error:  # torch fixes the inter-op pool once it has run parallel work
            log.warning("pytorch model '%s': cannot apply %s=%d (%s); torch keeps %d threads",
                        model, key, count, str(error).strip(), current())
