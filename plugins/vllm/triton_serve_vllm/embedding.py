"""Triton's vLLM embedding contract (engine process): an ``embedding_request`` JSON input with ``input`` (a text or a
list of token ids) and ``pooling_params`` (``{"dimensions": [d]}``); the embedding goes back as JSON in
``text_output``."""
from __future__ import annotations

import json
from typing import Any

from vllm.pooling_params import PoolingParams

from .protocol import Flags, Outputs
from .sampling import BadRequest


def pooling_request(text: str) -> tuple[Any, PoolingParams]:
    """The prompt and pooling parameters of one ``embedding_request``."""
    try:
        request = json.loads(text)
    except ValueError as error:
        raise BadRequest(f"'embedding_request' is not valid JSON: {error}") from None
    if not isinstance(request, dict) or "input" not in request:
        raise BadRequest("'embedding_request' must be a JSON object with an 'input'")
    given = request["input"]
    if isinstance(given, list) and given and all(isinstance(item, int) for item in given):
        prompt: Any = {"prompt_token_ids": given}
    elif isinstance(given, str):
        prompt = {"prompt": given}
    else:
        raise BadRequest("'input' of 'embedding_request' must be a text or a list of token ids")
    pooling = request.get("pooling_params") or {}
    dimensions = pooling.get("dimensions") if isinstance(pooling, dict) else None
    if dimensions:
        return prompt, PoolingParams(task="embed", dimensions=int(dimensions[0]))
    return prompt, PoolingParams(task="embed")


def embedding_outputs(output: Any, flags: Flags) -> Outputs:
    """The response of a finished embedding: its vector as JSON; no tokens were generated."""
    vector = output.outputs.data.tolist()
    return Outputs([json.dumps(vector)], num_output_tokens=[0] if flags.num_output_tokens else None,
                   num_input_tokens=len(output.prompt_token_ids) if flags.num_input_tokens else None)
