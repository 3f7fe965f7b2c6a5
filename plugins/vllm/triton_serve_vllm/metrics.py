"""Triton's vLLM metrics on the server's ``/metrics``: the families, descriptions and buckets of Triton's vLLM
backend (``src/utils/metrics.py``), labelled ``model`` and ``version``, and vLLM's own scheduler gauges under their
vLLM names. Fed by the engine process's ``MetricUpdate`` messages."""
from __future__ import annotations

from collections.abc import Sequence

from triton_serve.plugin import CustomMetric, custom_metrics

from .protocol import MetricUpdate

TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0)
TIME_PER_OUTPUT_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_LATENCY_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
REQUEST_N_BUCKETS = (1, 2, 5, 10, 20)


class VllmMetrics:
    """One model version's vLLM metrics; ``release`` removes them from ``/metrics``."""

    def __init__(self, model: str, version: int, token_buckets: Sequence[float]) -> None:
        labels = {"model": model, "version": str(version)}

        def metric(name: str, description: str, kind: str, buckets: Sequence[float] | None = None) -> CustomMetric:
            return custom_metrics.family(name, description, kind).metric(labels, buckets)

        self.prompt_tokens = metric("vllm:prompt_tokens_total", "Number of prefill tokens processed.", "counter")
        self.generation_tokens = metric("vllm:generation_tokens_total", "Number of generation tokens processed.",
                                        "counter")
        self.time_to_first_token = metric("vllm:time_to_first_token_seconds",
                                          "Histogram of time to first token in seconds.", "histogram",
                                          TIME_TO_FIRST_TOKEN_BUCKETS)
        self.time_per_output_token = metric("vllm:time_per_output_token_seconds",
                                            "Histogram of time per output token in seconds.", "histogram",
                                            TIME_PER_OUTPUT_TOKEN_BUCKETS)
        self.e2e_latency = metric("vllm:e2e_request_latency_seconds",
                                  "Histogram of end to end request latency in seconds.", "histogram",
                                  E2E_LATENCY_BUCKETS)
        self.request_prompt_tokens = metric("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                            "histogram", token_buckets)
        self.request_generation_tokens = metric("vllm:request_generation_tokens",
                                                "Number of generation tokens processed.", "histogram", token_buckets)
        self.request_params_n = metric("vllm:request_params_n", "Histogram of the n request parameter.",
                                       "histogram", REQUEST_N_BUCKETS)
        # vLLM's scheduler state, as vLLM's own server names it (Triton's backend does not report these)
        self.running = metric("vllm:num_requests_running", "Number of requests in model execution batches.",
                              "gauge")
        self.waiting = metric("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "gauge")
        self.kv_cache_usage = metric("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                                     "gauge")

    def apply(self, update: MetricUpdate) -> None:
        if update.prompt_tokens:
            self.prompt_tokens.increment(update.prompt_tokens)
        if update.generation_tokens:
            self.generation_tokens.increment(update.generation_tokens)
        for histogram, values in ((self.time_to_first_token, update.time_to_first_token),
                                  (self.time_per_output_token, update.time_per_output_token),
                                  (self.e2e_latency, update.e2e_latency),
                                  (self.request_prompt_tokens, update.request_prompt_tokens),
                                  (self.request_generation_tokens, update.request_generation_tokens),
                                  (self.request_params_n, update.request_params_n)):
            for value in values:
                histogram.observe(value)
        gauges: tuple[tuple[CustomMetric, float | None], ...] = (
            (self.running, update.running), (self.waiting, update.waiting),
            (self.kv_cache_usage, update.kv_cache_usage))
        for gauge, reading in gauges:
            if reading is not None:
                gauge.set(reading)

    def release(self) -> None:
        for metric in vars(self).values():
            metric.release()
