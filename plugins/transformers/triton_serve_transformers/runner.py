"""One forward pass over the running sequences: their new tokens packed into one row, the key-value cache in slots."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import torch

from .kv_cache import SlotCache


class Running(Protocol):
    """What the runner reads of a sequence: its tokens (prompt, then generated) and how many are in the cache."""

    tokens: list[int]
    cached: int


RunningT = TypeVar("RunningT", bound=Running)


class ModelRunner:
    """Feeds each sequence the tokens the cache lacks (a new sequence its prompt, a decoding one its last token) and
    returns the logits of each sequence's next token. The sequences are given in slot order; the decoding ones
    (``cached`` > 0) come first."""

    def __init__(self, model: Any, device: torch.device | str, context: int) -> None:
        self.model = model
        self.device = torch.device(device)
        self.context = context
        self.cache = SlotCache(self.device)

    def forward(self, sequences: Sequence[Running]) -> torch.Tensor:
        """Logits (sequences, vocabulary) of each sequence's next token; afterwards every token is cached."""
        ids: list[int] = []
        positions: list[int] = []
        decoding: list[int] = []
        prefills: list[tuple[int, int, int]] = []
        last: list[int] = []
        for slot, sequence in enumerate(sequences):
            new = sequence.tokens[sequence.cached:]
            if sequence.cached:
                assert not prefills and len(new) == 1, "decoding sequences hold the first slots, one token each"
                decoding.append(sequence.cached)
            else:
                prefills.append((slot, len(ids), len(new)))
            positions.extend(range(sequence.cached, sequence.cached + len(new)))
            ids.extend(new)
            last.append(len(ids) - 1)
        self.cache.plan(len(sequences), decoding, prefills, self.context)
        device = self.device
        output = self.model(input_ids=torch.tensor([ids], device=device),
                            position_ids=torch.tensor([positions], device=device), use_cache=False,
                            logits_to_keep=torch.tensor(last, device=device), slot_cache=self.cache)
        for sequence in sequences:
            sequence.cached = len(sequence.tokens)
        return output.logits[0]

    def release(self, sequences: list[RunningT], index: int) -> None:
        """Take ``sequences[index]`` out: the last sequence moves into its slot (keeping the slots dense)."""
        last = sequences.pop()
        if index < len(sequences):
            self.cache.move(len(sequences), index, last.cached)
            sequences[index] = last
        if not sequences:
            self.cache.clear()
