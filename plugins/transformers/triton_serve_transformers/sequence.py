"""One request being generated: what it asked for, its tokens, and the text they spell so far."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from triton_serve.plugin import InferenceRequest

# Prompt tokens decoded before the first generated one, so that its leading space is kept (vLLM's offset).
PROMPT_CONTEXT_TOKENS = 5


@dataclass
class Settings:
    """What a request asks of generation (the vLLM contract's sampling parameters and flags)."""

    max_tokens: int = 16
    min_tokens: int = 0
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


class Detokenizer:
    """The text of the generated tokens, decoded incrementally: each step decodes a short window of tokens and keeps
    what it adds to the text, holding back a character that is not complete yet (U+FFFD)."""

    def __init__(self, tokenizer: Any, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.tokens = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self.prefix = 0  # the window's first token
        self.read = len(self.tokens)  # tokens before it are in ``text``
        self.text = ""

    def _decode(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def add(self, token: int) -> str:
        """Take a generated token; returns the text it completes (maybe empty)."""
        self.tokens.append(token)
        return self.flush(final=False)

    def flush(self, *, final: bool = True) -> str:
        """The text the tokens taken so far add (with ``final``, even an incomplete character)."""
        before = self._decode(self.tokens[self.prefix:self.read])
        after = self._decode(self.tokens[self.prefix:])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(self.tokens)
        new = after[len(before):]
        self.text += new
        return new


@dataclass
class Sequence:
    """One request being generated: ``tokens`` are the prompt's then the generated ones; ``cached`` of them are in
    the key-value cache."""

    request: InferenceRequest
    prompt: str
    prompt_ids: list[int]
    settings: Settings
    detokenizer: Detokenizer
    tokens: list[int] = field(default_factory=list)
    cached: int = 0
    text_end: int = -1  # where a stop string cut the text; -1: not cut
    stop_from: int = 0  # stop strings must end past this much text (that of the first ``min_tokens`` tokens)
    sent_text: int = 0  # characters of text streamed so far
    counted: int = 0  # output tokens reported so far
    last_token_ns: int = 0  # when the previous token was generated (monotonic)
    generator: Any = None  # a torch.Generator when the request gave a seed
    # per output token, the vLLM backend's logprobs entry: {token id: {"logprob", "rank", "decoded_token"}}
    logprobs: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    cumulative_logprob: float = 0.0  # the sum of the output tokens' log-probabilities

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt_ids)

    @property
    def length(self) -> int:
        """The most positions the sequence can take: its prompt and ``max_tokens``."""
        return len(self.prompt_ids) + self.settings.max_tokens

    @property
    def generated(self) -> int:
        """Output tokens so far (an end-of-sequence token that ends the sequence is not one)."""
        return len(self.tokens) - len(self.prompt_ids)

    def output_ids(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]

    @property
    def text(self) -> str:
        text = self.detokenizer.text
        return text if self.text_end < 0 else text[:self.text_end]
