"""The transformers backend serving a tiny random-weight Llama model made here, through the OpenAI front-end: its
answers are those of the model run step by step in the test, alone or continuously batched with others."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from triton_serve.plugin import ServerOptions
from triton_serve.testing import RunningServer, free_port
from triton_serve_transformers.engine import ENGINES
from triton_serve_transformers.tiny import make_tiny_llama

CONFIG = """
backend: "transformers"
parameters { key: "max_num_seqs" value: { string_value: "4" } }
"""


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("llm_repo")
    (repo / "tiny").mkdir()
    (repo / "tiny" / "config.pbtxt").write_text(CONFIG)
    make_tiny_llama(repo / "tiny" / "1", context=128)
    return repo / "tiny" / "1"


@pytest.fixture(scope="module", params=[0, 2], ids=["in-process-frontends", "frontend-processes"])
def server(request: pytest.FixtureRequest, weights: Path) -> Iterator[RunningServer]:
    running = RunningServer(ServerOptions(
        model_repositories=[str(weights.parents[1])], http_port=free_port(), grpc_port=free_port(),
        metrics_port=free_port(), http_address="127.0.0.1", grpc_address="127.0.0.1", metrics_address="127.0.0.1",
        frontend_processes=request.param))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def reference(weights: Path) -> Any:
    """Greedy generation with the same weights, one sequence at a time: what the server must answer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(weights)
    model = AutoModelForCausalLM.from_pretrained(weights).eval()

    def generate(prompt: str, max_tokens: int) -> str:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        new: list[int] = []
        with torch.inference_mode():
            for _ in range(max_tokens):
                token = int(model(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax())
                if token == tokenizer.eos_token_id:
                    break
                new.append(token)
        return str(tokenizer.decode(new, skip_special_tokens=True))
    generate.tokenizer = tokenizer  # type: ignore[attr-defined]
    return generate


@pytest.fixture
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_greedy_completion_matches_the_model(client: openai.OpenAI, reference: Any) -> None:
    answer = client.completions.create(model="tiny", prompt="Hello there", max_tokens=12, temperature=0)
    assert answer.choices[0].text == reference("Hello there", 12)
    assert answer.usage is not None and answer.usage.prompt_tokens == len("Hello there")
    assert answer.usage.completion_tokens == len(reference.tokenizer(answer.choices[0].text,
                                                                     add_special_tokens=False)["input_ids"])


def test_chat_uses_the_tokenizer_template_and_streams(client: openai.OpenAI, reference: Any) -> None:
    messages = [{"role": "user", "content": "hi"}]
    prompt = reference.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = reference(prompt, 10)
    answer = client.chat.completions.create(model="tiny", messages=messages,  # type: ignore[arg-type]
                                            max_tokens=10, temperature=0)
    assert answer.choices[0].message.content == expected
    chunks = list(client.chat.completions.create(model="tiny", messages=messages,  # type: ignore[arg-type]
                                                 max_tokens=10, temperature=0, stream=True))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == expected
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_concurrent_streams_share_forward_passes(server: RunningServer, reference: Any) -> None:
    prompts = [f"request number {i} says" for i in range(6)]

    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0,
                                      timeout=60) as client:
            async def one(prompt: str) -> str:
                stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0,
                                                         stream=True)
                return "".join([chunk.choices[0].text async for chunk in stream])
            return await asyncio.gather(*(one(prompt) for prompt in prompts))

    before = max((engine.largest_batch for engine in ENGINES), default=0)
    assert asyncio.run(run()) == [reference(prompt, 16) for prompt in prompts]
    assert max(engine.largest_batch for engine in ENGINES) >= 2 or before >= 2  # they were batched together
    assert max(engine.largest_batch for engine in ENGINES) <= 4  # max_num_seqs


def test_seed_stop_and_length(client: openai.OpenAI, reference: Any) -> None:
    sampled = [client.completions.create(model="tiny", prompt="abc", max_tokens=8, temperature=1.0, seed=11)
               .choices[0].text for _ in range(2)]
    assert sampled[0] == sampled[1]
    full = reference("abc", 20)
    answer = client.completions.create(model="tiny", prompt="abc", max_tokens=5, temperature=0)
    assert (answer.choices[0].text, answer.choices[0].finish_reason) == (full[:5], "length")
    stop = full[6:8]
    answer = client.completions.create(model="tiny", prompt="abc", max_tokens=20, temperature=0, stop=[stop])
    assert answer.choices[0].text == full[:full.find(stop)]
    assert answer.choices[0].finish_reason == "stop"


def test_a_prompt_longer_than_the_context_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="its context is 128 tokens"):
        client.completions.create(model="tiny", prompt="x" * 200)
    assert client.completions.create(model="tiny", prompt="ok", max_tokens=2).choices[0].text is not None


def test_a_client_that_leaves_frees_its_sequence(server: RunningServer) -> None:
    steps = sum(engine.steps for engine in ENGINES)
    # Triton's generate extension, so that the sampling parameters can say ignore_eos: it runs 120 steps unless freed.
    parameters = '{"max_tokens": 120, "ignore_eos": true, "temperature": 0.8}'
    with httpx.stream("POST", f"http://{server.http_url}/v2/models/tiny/generate_stream", timeout=30, json={
            "text_input": "go", "stream": True, "sampling_parameters": parameters}) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: "):
                break
    deadline = time.monotonic() + 10
    while not all(engine.idle for engine in ENGINES):
        assert time.monotonic() < deadline, "the sequence was not freed"
        time.sleep(0.01)
    assert sum(engine.steps for engine in ENGINES) - steps < 100  # freed at once, not run to its 120 tokens


def test_generation_metrics(server: RunningServer, client: openai.OpenAI) -> None:
    client.completions.create(model="tiny", prompt="count me", max_tokens=4, temperature=0)
    text = httpx.get(f"http://127.0.0.1:{server.options.metrics_port}/metrics", timeout=10).text
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("tserve_llm_")}
    labels = '{model="tiny",version="1"}'
    assert values[f"tserve_llm_time_to_first_token_ms_count{labels}"] >= 1
    assert values[f"tserve_llm_inter_token_latency_ms_count{labels}"] >= 1
    assert values[f"tserve_llm_generated_tokens_total{labels}"] >= 2
    assert f"tserve_llm_running_sequences{labels}" in values
