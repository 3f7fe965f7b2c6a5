"""The next token of each running sequence from one step's logits, and the log-probabilities vLLM reports."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sequence import Sequence

GREEDY_BELOW = 1e-5  # a temperature under this is greedy (vLLM's)


@dataclass
class Scored:
    """A token's log-probability (of the model's distribution), its rank (1: the most likely) and the ``top`` most
    likely tokens with theirs, best first."""

    logprob: float
    rank: int
    top: list[tuple[int, float]]


def sample(logits: torch.Tensor, sequences: list[Sequence], stop_ids: list[int]) -> list[int]:
    """One token per row of ``logits`` (row i is ``sequences[i]``): penalties, ``min_tokens`` (no end-of-sequence
    token before it), then greedy or temperature and ``top_p`` sampling (with the sequence's generator, if seeded)."""
    adjusted = logits.float()
    changed = False
    for row, sequence in enumerate(sequences):
        settings = sequence.settings
        penalised = settings.presence_penalty or settings.frequency_penalty
        too_short = sequence.generated < settings.min_tokens and stop_ids
        if not (penalised and sequence.generated) and not too_short:
            continue
        if not changed:
            adjusted, changed = adjusted.clone(), True
        if penalised and sequence.generated:
            output = torch.tensor(sequence.output_ids(), device=adjusted.device)
            counts = torch.bincount(output, minlength=adjusted.shape[1]).to(adjusted.dtype)
            adjusted[row] -= settings.frequency_penalty * counts + settings.presence_penalty * (counts > 0)
        if too_short:
            adjusted[row, stop_ids] = float("-inf")
    tokens = [0] * len(sequences)
    greedy = [row for row, sequence in enumerate(sequences) if sequence.settings.temperature < GREEDY_BELOW]
    if greedy:
        for row, token in zip(greedy, adjusted[greedy].argmax(-1).tolist()):
            tokens[row] = token
    for row, sequence in enumerate(sequences):
        settings = sequence.settings
        if settings.temperature < GREEDY_BELOW:
            continue
        probabilities = torch.softmax(adjusted[row] / settings.temperature, dim=-1)
        if settings.top_p < 1:
            ordered, order = torch.sort(probabilities, descending=True)
            ordered[ordered.cumsum(-1) - ordered > settings.top_p] = 0
            probabilities = torch.zeros_like(probabilities).scatter(0, order, ordered)
        tokens[row] = int(torch.multinomial(probabilities, 1, generator=sequence.generator))
    return tokens


def score(logits: torch.Tensor, rows: list[int], tokens: list[int], tops: list[int]) -> list[Scored]:
    """For each of ``rows``: the log-softmax of its raw logits (before penalties and temperature: vLLM's default)
    at its sampled token, that token's rank, and its ``tops`` most likely tokens."""
    log_probabilities = torch.log_softmax(logits[rows].float(), dim=-1)
    chosen = log_probabilities.gather(1, torch.tensor([[tokens[row]] for row in rows],
                                                      device=log_probabilities.device))
    ranks = ((log_probabilities > chosen).sum(-1) + 1).tolist()
    values, ids = torch.topk(log_probabilities, min(max(tops), log_probabilities.shape[1]))
    values_list, ids_list, chosen_list = values.tolist(), ids.tolist(), chosen[:, 0].tolist()
    return [Scored(chosen_list[index], ranks[index], list(zip(ids_list[index][:top], values_list[index][:top])))
            for index, top in enumerate(tops)]
