"""The generation metrics of one model version on ``/metrics``."""
from __future__ import annotations

from triton_serve.plugin import custom_metrics

# Upper bounds of the latency histograms, in milliseconds.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class LLMMetrics:
    """One model version's generation metrics (beside Triton's ``nv_inference_first_response_histogram_ms``, which
    the core keeps for every decoupled model)."""

    def __init__(self, model: str, version: int) -> None:
        labels = {"model": model, "version": str(version)}
        self.first_token = custom_metrics.family(
            "tserve_llm_time_to_first_token_ms", "Time from a request's arrival to its first generated token, in "
            "milliseconds", "histogram").metric(labels, LATENCY_BUCKETS_MS)
        self.inter_token = custom_metrics.family(
            "tserve_llm_inter_token_latency_ms", "Time between two generated tokens of one sequence, in milliseconds",
            "histogram").metric(labels, LATENCY_BUCKETS_MS)
        self.tokens = custom_metrics.family(
            "tserve_llm_generated_tokens_total", "Tokens generated (rate() gives tokens per second)",
            "counter").metric(labels)
        self.running = custom_metrics.family(
            "tserve_llm_running_sequences", "Sequences in the running batch", "gauge").metric(labels)

    def release(self) -> None:
        for metric in (self.first_token, self.inter_token, self.tokens, self.running):
            metric.release()
