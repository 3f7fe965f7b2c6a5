"""The transformers backend serving a tiny random-weight Llama model made here, through the OpenAI front-end: its
answers are those of the model run step by step in the test, alone or continuously batched with others."""
from __future__ import annotations

import asyncio
import json
import math
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
    generate.model = model  # type: ignore[attr-defined]
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


def test_constrained_decoding_is_refused_by_name(server: RunningServer) -> None:
    for key in ("structured_outputs", "guided_decoding"):
        answer = httpx.post(f"http://{server.http_url}/v2/models/tiny/generate", timeout=30, json={
            "text_input": "hi", "sampling_parameters": f'{{"{key}": "{{\\"json_object\\": true}}"}}'})
        assert answer.status_code == 400
        assert f"sampling parameter '{key}' is not accepted" in answer.json()["error"]


def _model_logprobs(reference: Any, prompt: str, text: str) -> list[list[float]]:
    """Per token of ``text`` after ``prompt``, the model's log-probabilities over the vocabulary, best first."""
    import torch

    tokenizer = reference.tokenizer
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    new = tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logits = reference.model(input_ids=torch.tensor([ids + new])).logits[0, len(ids) - 1:-1]
    return [sorted(row, reverse=True) for row in torch.log_softmax(logits.float(), dim=-1).tolist()]


def _check_ranked(chosen: float, tops: list[float], best: list[float]) -> None:
    assert all(math.isfinite(value) for value in [chosen, *tops])
    assert tops == sorted(tops, reverse=True)
    assert chosen in tops  # greedy: the chosen token is the most likely
    assert tops == pytest.approx(best[:len(tops)], abs=1e-4)


def test_chat_logprobs(client: openai.OpenAI, reference: Any) -> None:
    messages: Any = [{"role": "user", "content": "hi"}]
    prompt = reference.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    answer = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=2)
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    text = answer.choices[0].message.content or ""
    assert content and "".join(token.token for token in content) == text
    best = _model_logprobs(reference, prompt, text)
    for token, row in zip(content, best, strict=True):
        assert len(token.top_logprobs) == 2
        _check_ranked(token.logprob, [top.logprob for top in token.top_logprobs], row)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=2, stream=True)
    streamed = [token for chunk in stream for choice in chunk.choices if choice.logprobs is not None
                for token in choice.logprobs.content or []]
    assert [(token.token, token.logprob) for token in streamed] == [(token.token, token.logprob) for token in content]


def test_completion_logprobs(client: openai.OpenAI, reference: Any) -> None:
    answer = client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0, logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs and logprobs.top_logprobs
    assert "".join(logprobs.tokens) == answer.choices[0].text
    best = _model_logprobs(reference, "abc", answer.choices[0].text)
    for chosen, tops, row in zip(logprobs.token_logprobs, logprobs.top_logprobs, best, strict=True):
        assert len(tops) == 2
        _check_ranked(chosen, list(tops.values()), row)
    stream = client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0, logprobs=2,
                                       stream=True)
    pieces = [choice.logprobs for chunk in stream for choice in chunk.choices if choice.logprobs is not None]
    assert [value for piece in pieces for value in piece.token_logprobs or []] == logprobs.token_logprobs
    assert [offset for piece in pieces for offset in piece.text_offset or []] == logprobs.text_offset


def test_cumulative_logprob_and_the_raw_contract(server: RunningServer, reference: Any) -> None:
    """Triton's generate extension with the vLLM contract's flags: ``logprobs`` entries keyed by token id with
    rank and decoded token, and ``cumulative_logprob`` their sum; no ``logprobs`` sampling parameter: null."""
    answer = httpx.post(f"http://{server.http_url}/v2/models/tiny/generate", timeout=30, json={
        "text_input": "abc", "sampling_parameters": '{"max_tokens": 5, "temperature": 0, "logprobs": 0}',
        "return_logprobs": True, "return_cumulative_logprob": True}).json()
    entries = json.loads(answer["logprobs"])
    assert len(entries) == 5 and all(len(entry) == 1 for entry in entries)  # logprobs 0: the chosen token only
    chosen = [next(iter(entry.items())) for entry in entries]
    assert "".join(item["decoded_token"] for _, item in chosen) == answer["text_output"]
    assert [reference.tokenizer.decode([int(token)]) for token, _ in chosen] == list(answer["text_output"])
    assert all(item["rank"] == 1 for _, item in chosen)
    assert answer["cumulative_logprob"] == pytest.approx(sum(item["logprob"] for _, item in chosen), abs=1e-4)
    answer = httpx.post(f"http://{server.http_url}/v2/models/tiny/generate", timeout=30, json={
        "text_input": "abc", "sampling_parameters": '{"max_tokens": 2}', "return_logprobs": True}).json()
    assert answer["logprobs"] == "null"
    answer = httpx.post(f"http://{server.http_url}/v2/models/tiny/generate", timeout=30, json={
        "text_input": "abc", "sampling_parameters": '{"logprobs": 21}', "return_logprobs": True})
    assert answer.status_code == 400 and "'logprobs' must be an integer from 0 to 20" in answer.json()["error"]
