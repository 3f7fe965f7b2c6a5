"""vLLM's request outputs as the responses of Triton's vLLM backend (engine process): one element per sequence
(``n``), each streamed response carrying what is new since the last one."""
from __future__ import annotations

import json
from typing import Any

from vllm.outputs import RequestOutput

from .protocol import Flags, Outputs


class ResponseShaper:
    """Turns the outputs of one request into ``Outputs``. Streaming requests get vLLM's deltas (a sequence with
    nothing new has empty text and no tokens in that response); the others get one response with everything."""

    def __init__(self, flags: Flags, n: int, logprobs_asked: bool) -> None:
        self.flags = flags
        self.n = n
        self.logprobs_asked = logprobs_asked
        self.first = True
        self.cumulative = [0.0] * n  # each sequence's cumulative logprob so far

    def outputs(self, output: RequestOutput) -> Outputs:
        flags, n = self.flags, self.n
        text = [""] * n
        finish = [""] * n if flags.finish_reason else None
        logprobs = ["[]" if self.logprobs_asked else "null"] * n if flags.logprobs else None
        counts = [0] * n if flags.num_output_tokens else None
        for completion in output.outputs:
            index = completion.index
            text[index] = completion.text
            if finish is not None:
                finish[index] = completion.finish_reason or ""
            if completion.cumulative_logprob is not None:
                self.cumulative[index] = completion.cumulative_logprob
            if logprobs is not None and completion.logprobs is not None:
                logprobs[index] = _logprobs_json(completion.logprobs)
            if counts is not None:
                counts[index] = len(completion.token_ids)
        if self.first and flags.prepend_input and output.prompt:
            text = [output.prompt + item for item in text]
        self.first = False
        return Outputs(text, finish, list(self.cumulative) if flags.cumulative_logprob else None, logprobs, counts,
                       len(output.prompt_token_ids or ()) if flags.num_input_tokens else None)


def _logprobs_json(positions: Any) -> str:
    """vLLM's logprobs of some new tokens as the backend's JSON: per token ``{"<id>": {"logprob", "rank",
    "decoded_token"}}``, in vLLM's order (the sampled token first, then the most likely ones)."""
    return json.dumps([{str(token): {"logprob": entry.logprob, "rank": entry.rank,
                                     "decoded_token": entry.decoded_token}
                        for token, entry in position.items()} for position in positions])
