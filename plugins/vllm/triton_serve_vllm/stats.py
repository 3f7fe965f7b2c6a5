"""vLLM's stat logger that gathers what Triton's vLLM backend reports, for the server (engine process)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from .protocol import MetricUpdate


class MetricGatherer:
    """Holds the update being gathered; ``on_record`` is called after each record (to send it soon)."""

    def __init__(self, on_record: Callable[[], None]) -> None:
        self.update = MetricUpdate()
        self.on_record = on_record

    def take(self) -> MetricUpdate | None:
        """The update gathered so far (None when empty), and a fresh one."""
        update, self.update = self.update, MetricUpdate()
        return update or None

    def factory(self, vllm_config: VllmConfig, engine_index: int = 0) -> StatLoggerBase:
        """vLLM's StatLoggerFactory."""
        return _StatLogger(self, vllm_config, engine_index)


class _StatLogger(StatLoggerBase):
    def __init__(self, gatherer: MetricGatherer, vllm_config: VllmConfig, engine_index: int = 0) -> None:
        self.gatherer = gatherer

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None,
               mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        update = self.gatherer.update
        if scheduler_stats is not None:
            update.running = scheduler_stats.num_running_reqs
            update.waiting = scheduler_stats.num_waiting_reqs
            update.kv_cache_usage = scheduler_stats.kv_cache_usage
        if iteration_stats is not None:
            update.prompt_tokens += iteration_stats.num_prompt_tokens
            update.generation_tokens += iteration_stats.num_generation_tokens
            update.time_to_first_token += iteration_stats.time_to_first_tokens_iter
            update.time_per_output_token += iteration_stats.inter_token_latencies_iter
            update.request_params_n += iteration_stats.n_params_iter
            for finished in iteration_stats.finished_requests:
                update.e2e_latency.append(finished.e2e_latency)
                update.request_prompt_tokens.append(finished.num_prompt_tokens)
                update.request_generation_tokens.append(finished.num_generation_tokens)
        self.gatherer.on_record()

    def log_engine_initialized(self) -> None:
        pass
