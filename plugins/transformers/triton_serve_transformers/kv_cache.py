"""The key-value cache of the running sequences and the attention that reads it.

The model is loaded with ``attn_implementation=ATTENTION``: transformers then calls ``slot_attention`` in every
attention layer with that step's queries, keys and values (positional encodings applied), and builds no mask for it.
One step is one forward pass over the running sequences packed into a single row of tokens: first one token for each
decoding sequence, then the whole prompt of each sequence that joins. Each sequence owns one slot of ``SlotCache``
(a row of per-layer key and value buffers); the decoding sequences hold slots 0..d-1, in the order of the packed row,
so their attention is one batched call over a view of the buffers, with no copy of the past keys and values."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

ATTENTION = "triton_serve_slots"  # the attention implementation's name in transformers' registry


@dataclass
class StepLayout:
    """Where one step's packed tokens belong: rows 0..decode-1 decode one token each (row i in slot i, written at
    ``positions[i]``), then each prefill ``(slot, start, length)`` holds a whole prompt."""

    decode: int
    positions: torch.Tensor  # (decode,) positions of the decoding tokens
    mask: torch.Tensor  # (decode, 1, 1, span) which cached positions each decoding token sees
    prefills: list[tuple[int, int, int]]


class SlotCache:
    """Per-layer key and value buffers of shape (slots, kv heads, capacity, head dim), made on first use by each
    layer and grown (never shrunk) to what ``plan`` asks; ``clear`` gives the memory back."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.slots = 0  # what the buffers must hold this step
        self.capacity = 0
        self.layout: StepLayout | None = None
        self._rows: dict[int, torch.Tensor] = {}  # arange(d) per d, for indexing the decoding slots

    def plan(self, slots: int, positions: list[int], prefills: list[tuple[int, int, int]], limit: int) -> None:
        """Lay out the next step: ``positions`` of the decoding tokens (slots 0..len-1), the prefills; grow the
        buffers to ``slots`` and to the longest sequence (doubling, up to ``limit`` positions)."""
        longest = max([position + 1 for position in positions] + [length for _, _, length in prefills])
        if longest > self.capacity:
            self.capacity = min(max(longest, 2 * self.capacity, 64), max(limit, longest))
        self.slots = max(self.slots, slots)
        decode = len(positions)
        span = max(positions, default=-1) + 1
        at = torch.tensor(positions, dtype=torch.long, device=self.device)
        columns = torch.arange(span, device=self.device)
        mask = columns[None, :] <= at[:, None]
        self.layout = StepLayout(decode, at, mask[:, None, None, :], prefills)

    def move(self, source: int, target: int, length: int) -> None:
        """Copy a sequence's first ``length`` positions from slot ``source`` into slot ``target``."""
        for buffers in (self.keys, self.values):
            for buffer in buffers.values():
                buffer[target, :, :length] = buffer[source, :, :length]

    def clear(self) -> None:
        """Drop the buffers (no sequence is running)."""
        self.keys.clear()
        self.values.clear()
        self.slots = self.capacity = 0
        self.layout = None

    def _buffers(self, layer: int, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys = self.keys.get(layer)
        if keys is None or keys.shape[0] < self.slots or keys.shape[2] < self.capacity:
            shape = (self.slots, key.shape[1], self.capacity, key.shape[3])
            grown = [torch.zeros(shape, dtype=key.dtype, device=key.device) for _ in range(2)]
            if keys is not None:
                old = (keys, self.values[layer])
                for new, before in zip(grown, old):
                    new[:before.shape[0], :, :before.shape[2]] = before
            self.keys[layer], self.values[layer] = grown
        return self.keys[layer], self.values[layer]

    def _decode_rows(self, count: int) -> torch.Tensor:
        rows = self._rows.get(count)
        if rows is None:
            rows = self._rows[count] = torch.arange(count, device=self.device)
        return rows

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None,
               sliding_window: int | None) -> torch.Tensor:
        """Store the step's keys and values in their slots and return the attention output, (1, tokens, heads,
        head dim), for the packed row ``query`` (1, heads, tokens, head dim) and ``key``/``value`` (1, kv heads,
        tokens, head dim)."""
        layout = self.layout
        assert layout is not None, "plan() lays out a step before the forward pass"
        keys, values = self._buffers(layer, key)
        heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[3]
        groups = heads // kv_heads
        output = query.new_empty(query.shape[2], heads, dim)
        decode = layout.decode
        if decode:
            rows = self._decode_rows(decode)
            keys[rows, :, layout.positions] = key[0, :, :decode].transpose(0, 1)
            values[rows, :, layout.positions] = value[0, :, :decode].transpose(0, 1)
            mask = layout.mask
            span = mask.shape[-1]
            if sliding_window:
                columns = torch.arange(span, device=query.device)
                mask = mask & (columns > layout.positions[:, None] - sliding_window)[:, None, None, :]
            # the query heads that share a key-value head attend together, as the rows of one query
            grouped = query[0, :, :decode].transpose(0, 1).reshape(decode, kv_heads, groups, dim)
            attended = scaled_dot_product_attention(grouped, keys[:decode, :, :span], values[:decode, :, :span],
                                                    attn_mask=mask, scale=scaling)
            output[:decode] = attended.reshape(decode, heads, dim)
        for slot, start, length in layout.prefills:
            new_keys, new_values = key[0, :, start:start + length], value[0, :, start:start + length]
            keys[slot, :, :length] = new_keys
            values[slot, :, :length] = new_values
            if groups > 1:
                new_keys = new_keys.repeat_interleave(groups, dim=0)
                new_values = new_values.repeat_interleave(groups, dim=0)
            window = None
            if sliding_window and length > sliding_window:
                places = torch.arange(length, device=query.device)
                distance = places[:, None] - places[None, :]
                window = (distance >= 0) & (distance < sliding_window)
            attended = scaled_dot_product_attention(query[0, :, start:start + length], new_keys, new_values,
                                                    attn_mask=window, is_causal=window is None, scale=scaling)
            output[start:start + length] = attended.transpose(0, 1)
        return output.unsqueeze(0)


def slot_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                   sliding_window: int | None = None, slot_cache: SlotCache | None = None, softcap: float | None = None,
                   s_aux: torch.Tensor | None = None, **_: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: the forward pass hands over the cache as ``slot_cache``."""
    if slot_cache is None:
        raise RuntimeError(f"attention '{ATTENTION}' runs only inside the transformers backend's engine")
    if softcap is not None or s_aux is not None:
        raise NotImplementedError("attention with logit soft-capping or sinks is not supported by this engine")
    return slot_cache.attend(module.layer_idx, query, key, value, scaling, sliding_window), None


def register_attention() -> str:
    """Make ``ATTENTION`` known to transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, slot_attention)
    return ATTENTION
