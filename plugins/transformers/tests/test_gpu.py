"""KIND_GPU: the engine and its key-value cache on CUDA; runs only where torch can use CUDA."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from triton_serve.testing import RunningServer
from triton_serve_transformers.engine import ENGINES
from triton_serve_transformers.tiny import make_tiny_llama

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU that torch can use")]

CONFIG = """
backend: "transformers"
instance_group [ { kind: KIND_GPU gpus: [0] } ]
parameters { key: "max_num_seqs" value: { string_value: "3" } }
"""


def test_kind_gpu_generates_on_cuda(tmp_path: Path, tserve: Callable[..., RunningServer]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    weights = make_tiny_llama(tmp_path / "models" / "tiny" / "1", context=128)
    (tmp_path / "models" / "tiny" / "config.pbtxt").write_text(CONFIG)
    server = tserve(tmp_path / "models")
    tokenizer = AutoTokenizer.from_pretrained(weights)
    model: Any = AutoModelForCausalLM.from_pretrained(weights)
    model = model.to("cuda:0").eval()

    def reference(prompt: str, max_tokens: int) -> str:
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"].to("cuda:0")
        with torch.inference_mode():
            new = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_tokens)[0, ids.shape[1]:].tolist()
        return str(tokenizer.decode(new, skip_special_tokens=True))

    jobs = [("a", 20), ("Hello there", 9), ("x" * 40, 15), ("go", 12), ("abc", 6)]

    async def run(sampling: list[dict[str, Any]]) -> list[str]:
        async with httpx.AsyncClient(timeout=120) as http:
            async def one(prompt: str, parameters: dict[str, Any]) -> str:
                answer = await http.post(f"http://{server.http_url}/v2/models/tiny/generate", json={
                    "text_input": prompt, "sampling_parameters": json.dumps(parameters)})
                assert answer.status_code == 200, answer.text
                return str(answer.json()["text_output"])
            return await asyncio.gather(*(one(prompt, parameters) for (prompt, _), parameters in zip(jobs, sampling)))

    greedy = [{"max_tokens": max_tokens, "temperature": 0} for _, max_tokens in jobs]
    assert asyncio.run(run(greedy)) == [reference(prompt, max_tokens) for prompt, max_tokens in jobs]
    assert any(str(engine.device).startswith("cuda") for engine in ENGINES)
    seeded = [{"max_tokens": 20, "temperature": 1.0, "seed": 3}]
    assert asyncio.run(run(seeded)) == asyncio.run(run(seeded))  # a seed's generator lives on the GPU
