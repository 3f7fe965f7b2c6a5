"""``POST /v1/embeddings`` over the vLLM backend's embedding contract, as Triton's front-end speaks it: an
``embedding_request`` input (JSON: ``input`` and ``pooling_params``), ``return_num_input_tokens``, and the
embedding as a JSON list of floats in ``text_output``. Each input of a list is one inference request."""
from __future__ import annotations

import asyncio
import base64
import json
import uuid
from typing import Any

import numpy as np

from triton_serve.frontend import DataPlaneAPI, InferenceRequest, ModelConfig

from .contract import input_tensor, output_count, output_string
from .errors import OpenAIError, bad_field

ENCODINGS = ("float", "base64")


def embedding_inputs(body: dict[str, Any]) -> list[str | list[int]]:
    """The texts (or token-id lists) to embed: one, or a non-empty list of them."""
    value = body.get("input")
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(item, int) and not isinstance(item, bool) for item in value):
            return [value]
        if all(isinstance(item, str) and item for item in value):
            return list(value)
        if all(isinstance(item, list) and item and all(isinstance(token, int) for token in item) for item in value):
            return list(value)
    raise bad_field("input", "'input' must be a non-empty string, a list of them, or token ids")


async def create_embeddings(api: DataPlaneAPI, name: str, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's embeddings answer for ``body`` from model ``name``."""
    inputs = embedding_inputs(body)
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise bad_field("dimensions", f"'dimensions' must be a positive integer, got {dimensions!r}")
    encoding = body.get("encoding_format", "float") or "float"
    if encoding not in ENCODINGS:
        raise bad_field("encoding_format", f"'encoding_format' must be 'float' or 'base64', got {encoding!r}")
    specs = {spec.name: spec for spec in config.input}
    if "embedding_request" not in specs:
        raise OpenAIError(f"model '{name}' does not produce embeddings: it has no 'embedding_request' input (the "
                          "vLLM backend's embedding contract)", 400, param="model")
    pooling = {"dimensions": [dimensions]} if dimensions is not None else {}
    requests = []
    for index, item in enumerate(inputs):
        values: dict[str, list[Any]] = {
            "embedding_request": [json.dumps({"input": item, "pooling_params": pooling}).encode()],
            "return_num_input_tokens": [True], "return_num_output_tokens": [True]}
        tensors = {key: input_tensor(config, specs[key], items) for key, items in values.items() if key in specs}
        requests.append(InferenceRequest(name, inputs=tensors, id=f"embd-{uuid.uuid4().hex}-{index}"))
    try:
        for request in requests:
            api.submit(request)
        results = await asyncio.gather(*(_embedding(request) for request in requests))
    finally:
        for request in requests:
            if not request.finished:
                request.cancel()
    data = [{"object": "embedding", "index": index,
             "embedding": vector if encoding == "float" else
             base64.b64encode(np.asarray(vector, dtype=np.float32).tobytes()).decode()}
            for index, (vector, _tokens) in enumerate(results)]
    counts = [tokens for _vector, tokens in results]
    usage = None if any(count is None for count in counts) else {
        "prompt_tokens": sum(count or 0 for count in counts), "total_tokens": sum(count or 0 for count in counts)}
    return {"object": "list", "data": data, "model": name, "usage": usage}


async def _embedding(request: InferenceRequest) -> tuple[list[float], int | None]:
    """The embedding the model answered, and its count of input tokens."""
    vector: list[float] | None = None
    tokens = None
    async for response, _final in request.responses():
        if response is None:
            continue
        if response.error is not None:
            raise response.error
        text = output_string(response, "text_output")
        if text is not None and vector is None:
            try:
                decoded = json.loads(text)
            except ValueError:
                decoded = None
            if not isinstance(decoded, list) or not all(isinstance(value, (int, float)) for value in decoded):
                raise OpenAIError(f"model '{request.model_name}' answered no embedding: 'text_output' must be a "
                                  "JSON list of numbers", 500)
            vector = [float(value) for value in decoded]
        tokens = output_count(response, "num_input_tokens") if tokens is None else tokens
    if vector is None:
        raise OpenAIError(f"model '{request.model_name}' answered no embedding ('text_output')", 500)
    return vector, tokens
