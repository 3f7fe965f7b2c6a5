"""The generation loop of one model instance: continuous batching on a thread of its own.

Every step is one forward pass over all running sequences (left-padded into one batch); each gets its next token,
and new sequences join between steps while ``max_num_seqs`` and ``max_tokens_in_flight`` allow. A sequence leaves at
once when it finishes or its request is cancelled. Each step recomputes the sequences' whole context (no key-value
cache is kept between steps): simple and exact, at the cost of compute that grows with the context; the tiny and
small models this backend is for are fast enough."""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triton_serve.plugin import InferenceRequest, InferenceResponse, ServerError, Status, Tensor, custom_metrics

log = logging.getLogger(__name__)

# Every engine running in this process (tests read their counters).
ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()

# Upper bounds of the latency histograms, in milliseconds.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class LLMMetrics:
    """One model version's generation metrics on ``/metrics`` (beside Triton's
    ``nv_inference_first_response_histogram_ms``, which the core keeps for every decoupled model)."""

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


@dataclass
class Settings:
    """What a request asks of generation (the vLLM contract's sampling parameters and flags)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    exclude_input: bool = True
    return_input_tokens: bool = False
    return_output_tokens: bool = False
    return_finish_reason: bool = False
    logprobs: int | None = None  # vLLM's ``logprobs``: how many of the most likely tokens to report per new token
    return_logprobs: bool = False
    return_cumulative_logprob: bool = False

    @property
    def scores(self) -> bool:
        """Whether generation must compute the tokens' log-probabilities for this request."""
        return self.return_cumulative_logprob or (self.return_logprobs and self.logprobs is not None)


@dataclass
class Sequence:
    """One request being generated."""

    request: InferenceRequest
    prompt: str
    prompt_ids: list[int]
    settings: Settings
    generated: list[int] = field(default_factory=list)
    sent_text: str = ""  # streamed so far
    counted: int = 0  # output tokens reported so far
    last_token_ns: int = 0  # when the previous token was generated (monotonic)
    generator: Any = None  # a torch.Generator when the request gave a seed
    # per generated token, the vLLM backend's logprobs entry: {token id: {"logprob", "rank", "decoded_token"}}
    logprobs: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    cumulative_logprob: float = 0.0  # the sum of the generated tokens' log-probabilities

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + self.settings.max_tokens


class Engine:
    """``add`` sequences from the event loop; the engine's thread generates them and sends their responses through
    the loop. ``stop`` ends the thread and fails what is left."""

    def __init__(self, model: Any, tokenizer: Any, device: str, loop: asyncio.AbstractEventLoop, *,
                 max_num_seqs: int, max_tokens_in_flight: int, name: str, metrics: LLMMetrics | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.loop = loop
        self.max_num_seqs = max_num_seqs
        self.max_tokens_in_flight = max_tokens_in_flight
        self.metrics = metrics
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (self.eos or 0)
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._wake = threading.Condition()
        self._stopping = False
        self.steps = 0  # forward passes so far
        self.largest_batch = 0  # most sequences one forward pass served
        self._thread = threading.Thread(target=self._run, name=f"transformers-{name}", daemon=True)
        self._thread.start()
        ENGINES.add(self)

    @property
    def idle(self) -> bool:
        """No sequence waits or runs."""
        return not self._waiting and not self._running

    def add(self, sequence: Sequence) -> None:
        with self._wake:
            self._waiting.append(sequence)
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()
        if self.metrics is not None:
            self.metrics.release()

    # ---- the engine's thread ----------------------------------------------------------------

    def _run(self) -> None:
        import torch

        with torch.inference_mode():
            while True:
                with self._wake:
                    while not self._waiting and not self._running and not self._stopping:
                        self._wake.wait()
                    if self._stopping:
                        break
                    self._admit()
                self._running = [seq for seq in self._running if not self._cancelled(seq)]
                if not self._running:
                    continue
                try:
                    self._step()
                except Exception as error:  # a framework failure fails the batch, not the engine
                    log.exception("generation step failed")
                    for sequence in self._running:
                        self._fail(sequence, ServerError(f"generation failed: {error}", Status.INTERNAL))
                    self._running = []
        gone = ServerError("the model was unloaded while generating", Status.UNAVAILABLE)
        for sequence in [*self._running, *self._waiting]:
            self._fail(sequence, gone)

    def _admit(self) -> None:
        """Move waiting sequences into the running batch while the limits allow (always at least one)."""
        in_flight = sum(sequence.length for sequence in self._running)
        while self._waiting and len(self._running) < self.max_num_seqs:
            sequence = self._waiting[0]
            if self._running and self.max_tokens_in_flight and in_flight + sequence.length > self.max_tokens_in_flight:
                break
            self._waiting.popleft()
            self._running.append(sequence)
            in_flight += sequence.length

    def _cancelled(self, sequence: Sequence) -> bool:
        if not sequence.request.cancelled.is_set():
            return False
        self._fail(sequence, ServerError("the request was cancelled", Status.CANCELLED))
        return True

    def _step(self) -> None:
        import torch

        contexts = [sequence.prompt_ids + sequence.generated for sequence in self._running]
        width = max(len(context) for context in contexts)
        ids = torch.full((len(contexts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for row, context in enumerate(contexts):
            ids[row, width - len(context):] = torch.tensor(context, dtype=torch.long)
            mask[row, width - len(context):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        output = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                            position_ids=positions.to(self.device), use_cache=False)
        logits = output.logits[:, -1, :].float().cpu()
        self.steps += 1
        self.largest_batch = max(self.largest_batch, len(contexts))
        if self.metrics is not None:
            self.metrics.running.set(len(contexts))
        # rows whose requests asked for logprobs: their log-softmax, from this step's logits
        scored = {row: index for index, row in enumerate(
            row for row, sequence in enumerate(self._running) if sequence.settings.scores)}
        log_probabilities = torch.log_softmax(logits[list(scored)], dim=-1) if scored else None
        still_running = []
        for row, sequence in enumerate(self._running):
            token = self._sample(sequence, logits[row])
            if log_probabilities is not None and row in scored:
                self._score(sequence, log_probabilities[scored[row]], token)
            if not self._advance(sequence, token):
                still_running.append(sequence)
        self._running = still_running

    @staticmethod
    def _sample(sequence: Sequence, logits: Any) -> int:
        import torch

        settings = sequence.settings
        if sequence.generated and (settings.presence_penalty or settings.frequency_penalty):
            counts = torch.bincount(torch.tensor(sequence.generated), minlength=logits.shape[0]).float()
            logits = logits - settings.frequency_penalty * counts - settings.presence_penalty * (counts > 0).float()
        if settings.temperature <= 0:
            return int(torch.argmax(logits))
        probabilities = torch.softmax(logits / settings.temperature, dim=-1)
        if settings.top_p < 1:
            ordered, order = torch.sort(probabilities, descending=True)
            outside = ordered.cumsum(-1) - ordered > settings.top_p
            ordered[outside] = 0
            probabilities = torch.zeros_like(probabilities).scatter(0, order, ordered)
        return int(torch.multinomial(probabilities, 1, generator=sequence.generator))

    def _score(self, sequence: Sequence, log_probabilities: Any, token: int) -> None:
        """Record the sampled token's log-probability (of the model's distribution, before temperature and
        penalties, as vLLM reports them) and, when asked, the most likely tokens' with their ranks (1: the most
        likely). The end-of-sequence token that ends a sequence is not an output token and gets no entry."""
        import torch

        if token == self.eos and not sequence.settings.ignore_eos:
            return
        chosen = float(log_probabilities[token])
        sequence.cumulative_logprob += chosen
        top = sequence.settings.logprobs
        if not sequence.settings.return_logprobs or top is None:
            return
        rank = int((log_probabilities > chosen).sum()) + 1
        entry = {str(token): {"logprob": chosen, "rank": rank, "decoded_token": self.tokenizer.decode([token])}}
        if top:
            values, ids = torch.topk(log_probabilities, min(top, log_probabilities.shape[0]))
            for position, (value, candidate) in enumerate(zip(values.tolist(), ids.tolist())):
                entry.setdefault(str(candidate), {"logprob": value, "rank": position + 1,
                                                  "decoded_token": self.tokenizer.decode([candidate])})
        sequence.logprobs.append(entry)

    def _advance(self, sequence: Sequence, token: int) -> bool:
        """Take the sampled token; send what the client should see now. True when the sequence finished."""
        settings = sequence.settings
        if self.metrics is not None:
            now = time.monotonic_ns()
            if sequence.last_token_ns:
                self.metrics.inter_token.observe((now - sequence.last_token_ns) / 1e6)
            else:
                self.metrics.first_token.observe((now - sequence.request.arrival_ns) / 1e6)
            sequence.last_token_ns = now
            self.metrics.tokens.increment(1)
        reason = None
        if token == self.eos and not settings.ignore_eos:
            reason = "stop"
        else:
            sequence.generated.append(token)
        text = self.tokenizer.decode(sequence.generated, skip_special_tokens=True)
        for stop in settings.stop:
            at = text.find(stop)
            if at >= 0:
                text, reason = text[:at], "stop"
        if reason is None and len(sequence.generated) >= settings.max_tokens:
            reason = "length"
        if settings.stream:
            hold = max((len(stop) for stop in settings.stop), default=1) - 1 if reason is None else 0
            visible = text[:len(text) - hold] if hold else text
            delta = visible[len(sequence.sent_text):] if visible.startswith(sequence.sent_text) else ""
            if delta or reason is not None:
                prefix = sequence.prompt if not settings.exclude_input and not sequence.sent_text \
                    and not sequence.counted else ""
                count = len(sequence.generated) - sequence.counted
                sequence.sent_text = visible
                sequence.counted = len(sequence.generated)
                self._send(sequence, prefix + delta, count, reason, sequence.logprobs[-count:] if count else [])
        elif reason is not None:
            full = text if settings.exclude_input else sequence.prompt + text
            self._send(sequence, full, len(sequence.generated), reason, sequence.logprobs)
        return reason is not None

    def _send(self, sequence: Sequence, text: str, count: int, reason: str | None,
              logprobs: list[dict[str, dict[str, Any]]]) -> None:
        """One response: the text, and the outputs the request asked for (for ``logprobs``, the entries of the
        response's new tokens; ``cumulative_logprob`` is the total so far, as the vLLM backend sends them)."""
        settings = sequence.settings
        outputs = [Tensor("text_output", "BYTES", (1,), np.array([text.encode()], dtype=np.object_))]
        if settings.return_input_tokens:
            outputs.append(Tensor("num_input_tokens", "UINT32", (1,),
                                  np.array([len(sequence.prompt_ids)], dtype=np.uint32)))
        if settings.return_output_tokens:
            outputs.append(Tensor("num_output_tokens", "UINT32", (1,), np.array([count], dtype=np.uint32)))
        if settings.return_finish_reason and reason is not None:
            outputs.append(Tensor("finish_reason", "BYTES", (1,), np.array([reason.encode()], dtype=np.object_)))
        if settings.return_cumulative_logprob:
            outputs.append(Tensor("cumulative_logprob", "FP32", (1,),
                                  np.array([sequence.cumulative_logprob], dtype=np.float32)))
        if settings.return_logprobs:
            text_logprobs = "null" if settings.logprobs is None else json.dumps(logprobs)
            outputs.append(Tensor("logprobs", "BYTES", (1,), np.array([text_logprobs.encode()], dtype=np.object_)))
        self.loop.call_soon_threadsafe(_deliver, sequence.request, InferenceResponse(outputs), reason is not None)

    def _fail(self, sequence: Sequence, error: ServerError) -> None:
        self.loop.call_soon_threadsafe(_deliver, sequence.request, InferenceResponse.from_error(error), True)


def _deliver(request: InferenceRequest, response: InferenceResponse, final: bool) -> None:
    """Event loop: one response of a sequence (none after its request finished: a cancelled one may have)."""
    if not request.finished:
        request.send(response, final=final)
