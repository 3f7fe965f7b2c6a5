"""The generation loop of one model instance: continuous batching over a key-value cache, on a thread of its own.

Every step is one forward pass (``ModelRunner``): one new token for each decoding sequence and the whole prompt of
each sequence that joins, their keys and values kept in the cache between steps. New sequences join between steps
while ``max_num_seqs`` and ``max_tokens_in_flight`` allow; a sequence leaves, and frees its place in the cache, as
soon as it finishes or its request is cancelled."""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import weakref
from collections import deque
from types import SimpleNamespace
from typing import Any

import numpy as np

from triton_serve.plugin import InferenceRequest, InferenceResponse, ServerError, Status, Tensor

from .metrics import LLMMetrics
from .runner import ModelRunner
from .sampler import Scored, sample, score
from .sequence import Sequence

log = logging.getLogger(__name__)

# Every engine running in this process (tests read their counters).
ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokens that end a sequence: the tokenizer's end-of-sequence token and the generation config's."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(token for token in ids if token is not None)


class Engine:
    """``add`` sequences from the event loop; the engine's thread generates them and sends their responses through
    the loop. ``stop`` ends the thread and fails what is left."""

    def __init__(self, model: Any, tokenizer: Any, device: str, loop: asyncio.AbstractEventLoop, *, context: int,
                 max_num_seqs: int, max_tokens_in_flight: int, name: str, metrics: LLMMetrics | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.loop = loop
        self.max_num_seqs = max_num_seqs
        self.max_tokens_in_flight = max_tokens_in_flight
        self.metrics = metrics
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.runner = ModelRunner(model, device, context)
        self._names: dict[int, str] = {}  # decoded_token of each token id reported so far
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # in cache-slot order
        self._wake = threading.Condition()
        self._stopping = False
        self.steps = 0  # forward passes so far
        self.largest_batch = 0  # most sequences one forward pass served
        self._check_model()
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

    def _check_model(self) -> None:
        """One forward pass of one token, so that a model the engine cannot run fails its load, not a request."""
        import torch

        with torch.inference_mode():
            self.runner.forward([SimpleNamespace(tokens=[self.stop_ids[0] if self.stop_ids else 0], cached=0)])
        self.runner.cache.clear()

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
                    self._drop_cancelled()
                    self._admit()
                if not self._running:
                    continue
                try:
                    self._step()
                except Exception as error:  # a framework failure fails the batch, not the engine
                    log.exception("generation step failed")
                    for sequence in self._running:
                        self._fail(sequence, ServerError(f"generation failed: {error}", Status.INTERNAL))
                    self._running = []
                    self.runner.cache.clear()
        gone = ServerError("the model was unloaded while generating", Status.UNAVAILABLE)
        for sequence in [*self._running, *self._waiting]:
            self._fail(sequence, gone)

    def _drop_cancelled(self) -> None:
        """Answer cancelled requests CANCELLED and free their places (waiting or running)."""
        cancelled = ServerError("the request was cancelled", Status.CANCELLED)
        if any(sequence.request.cancelled.is_set() for sequence in self._waiting):
            kept: deque[Sequence] = deque()
            for sequence in self._waiting:
                if sequence.request.cancelled.is_set():
                    self._fail(sequence, cancelled)
                else:
                    kept.append(sequence)
            self._waiting = kept
        for index in reversed(range(len(self._running))):
            if self._running[index].request.cancelled.is_set():
                self._fail(self._running[index], cancelled)
                self.runner.release(self._running, index)
                if self.metrics is not None:
                    self.metrics.running.set(len(self._running))

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

    def _step(self) -> None:
        running = self._running
        logits = self.runner.forward(running)
        self.steps += 1
        self.largest_batch = max(self.largest_batch, len(running))
        tokens = sample(logits, running, self.stop_ids)
        rows = [row for row, sequence in enumerate(running) if sequence.settings.scores]
        scored: dict[int, Scored] = {}
        if rows:
            tops = [running[row].settings.logprobs or 0 for row in rows]
            scored = dict(zip(rows, score(logits, rows, tokens, tops)))
        finished = [self._advance(sequence, tokens[row], scored.get(row)) for row, sequence in enumerate(running)]
        for index in reversed(range(len(running))):
            if finished[index]:
                self.runner.release(running, index)
        if self.metrics is not None:
            self.metrics.running.set(len(running))

    def _advance(self, sequence: Sequence, token: int, scored: Scored | None) -> bool:
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
        if token in self.stop_ids and not settings.ignore_eos:
            reason = "stop"  # the end-of-sequence token is not an output token: not in the text, counts or logprobs
        else:
            sequence.tokens.append(token)
            if scored is not None:
                self._record(sequence, token, scored)
            before = len(sequence.detokenizer.text)
            sequence.detokenizer.add(token)
            if settings.stop and sequence.generated > settings.min_tokens:
                reason = self._find_stop(sequence, before)
            elif sequence.generated == settings.min_tokens:
                sequence.stop_from = len(sequence.detokenizer.text)
        if reason is None and sequence.generated >= settings.max_tokens:
            reason = "length"
        if reason is not None and sequence.text_end < 0:
            sequence.detokenizer.flush()
        text = sequence.text
        if settings.stream:
            hold = max(len(stop) for stop in settings.stop) - 1 if settings.stop and reason is None else 0
            visible = max(len(text) - hold, sequence.sent_text)
            if visible > sequence.sent_text or reason is not None:
                prefix = sequence.prompt if not settings.exclude_input and not sequence.sent_text \
                    and not sequence.counted else ""
                count = sequence.generated - sequence.counted
                delta = text[sequence.sent_text:visible]
                sequence.sent_text = visible
                sequence.counted = sequence.generated
                self._send(sequence, prefix + delta, count, reason, sequence.logprobs[-count:] if count else [])
        elif reason is not None:
            full = text if settings.exclude_input else sequence.prompt + text
            self._send(sequence, full, sequence.generated, reason, sequence.logprobs)
        return reason is not None

    @staticmethod
    def _find_stop(sequence: Sequence, before: int) -> str | None:
        """Cut the text at the stop string that ends earliest among the new characters (and after the text of the
        first ``min_tokens`` tokens, as vLLM checks); "stop" when one did."""
        text = sequence.detokenizer.text
        first_new = max(before, sequence.stop_from)
        if len(text) <= first_new:
            return None
        best_end, best_at = len(text) + 1, -1
        for stop in sequence.settings.stop:
            at = text.find(stop, max(first_new - len(stop) + 1, 0))
            if at >= 0 and at + len(stop) < best_end:
                best_end, best_at = at + len(stop), at
        if best_at < 0:
            return None
        sequence.text_end = best_at
        return "stop"

    def _record(self, sequence: Sequence, token: int, scored: Scored) -> None:
        """The token's logprobs entry, as vLLM orders it: the sampled token first, then the most likely ones."""
        sequence.cumulative_logprob += scored.logprob
        settings = sequence.settings
        if not settings.return_logprobs or settings.logprobs is None:
            return
        entry = {str(token): {"logprob": scored.logprob, "rank": scored.rank, "decoded_token": self._name(token)}}
        for rank, (candidate, value) in enumerate(scored.top, start=1):
            entry.setdefault(str(candidate), {"logprob": value, "rank": rank, "decoded_token": self._name(candidate)})
        sequence.logprobs.append(entry)

    def _name(self, token: int) -> str:
        """A token's text alone (vLLM's ``decoded_token``: a SentencePiece word start keeps its space)."""
        name = self._names.get(token)
        if name is None:
            name = str(self.tokenizer.decode([token]))
            piece = self.tokenizer.convert_ids_to_tokens(token)
            if isinstance(piece, str) and piece.startswith("\u2581") and not name.startswith(" "):
                name = " " + name
            self._names[token] = name
        return name

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
