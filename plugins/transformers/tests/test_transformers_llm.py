"""The transformers backend serving a tiny random-weight Llama model made here, through the OpenAI front-end and
Triton's generate extension: its answers are those of transformers' own ``generate`` on the same weights, alone or
continuously batched with others."""
from __future__ import annotations

import asyncio
import json
import math
import shutil
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
STOPS_PROMPT = "Hello there"


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("llm_repo")
    (repo / "tiny").mkdir()
    (repo / "tiny" / "config.pbtxt").write_text(CONFIG)
    make_tiny_llama(repo / "tiny" / "1", context=128)
    return repo / "tiny" / "1"


@pytest.fixture(scope="module")
def reference(weights: Path) -> Any:
    """Greedy ``model.generate`` with the same weights, one sequence at a time: what the server must answer (the
    text of the new tokens, without the end-of-sequence token that stopped them)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(weights)
    model = AutoModelForCausalLM.from_pretrained(weights).eval()

    def ids(prompt: str, max_tokens: int, **options: Any) -> list[int]:
        prompt_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            output = model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), do_sample=False,
                                    max_new_tokens=max_tokens, **options)
        new = output[0, prompt_ids.shape[1]:].tolist()
        stops = options.get("eos_token_id", [tokenizer.eos_token_id])
        return new[:-1] if new and new[-1] in stops else new

    def generate(prompt: str, max_tokens: int, **options: Any) -> str:
        return str(tokenizer.decode(ids(prompt, max_tokens, **options), skip_special_tokens=True))
    generate.ids = ids  # type: ignore[attr-defined]
    generate.tokenizer = tokenizer  # type: ignore[attr-defined]
    generate.model = model  # type: ignore[attr-defined]
    return generate


@pytest.fixture(scope="module")
def stop_token(weights: Path, reference: Any) -> int:
    """Model ``stops``: the same weights, whose generation config adds a second end-of-sequence token, the third
    that greedy generation gives after STOPS_PROMPT (so it ends that answer early unless told otherwise)."""
    token = reference.ids(STOPS_PROMPT, 3)[2]
    assert token != reference.tokenizer.eos_token_id
    stops = weights.parents[1] / "stops"
    shutil.copytree(weights, stops / "1")
    (stops / "config.pbtxt").write_text('backend: "transformers"\n')
    config = json.loads((stops / "1" / "generation_config.json").read_text())
    config["eos_token_id"] = [reference.tokenizer.eos_token_id, token]
    (stops / "1" / "generation_config.json").write_text(json.dumps(config))
    return int(token)


@pytest.fixture(scope="module", params=[0, 2], ids=["in-process-frontends", "frontend-processes"])
def server(request: pytest.FixtureRequest, weights: Path, stop_token: int) -> Iterator[RunningServer]:
    running = RunningServer(ServerOptions(
        model_repositories=[str(weights.parents[1])], http_port=free_port(), grpc_port=free_port(),
        metrics_port=free_port(), http_address="127.0.0.1", grpc_address="127.0.0.1", metrics_address="127.0.0.1",
        frontend_processes=request.param))
    yield running
    running.stop()


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


def _stream(client: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> Any:
    async def text() -> str:
        stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                                 stream=True)
        return "".join([chunk.choices[0].text async for chunk in stream])
    return text()


def _async_client(server: RunningServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_concurrent_sequences_of_different_lengths_match_generate(server: RunningServer, reference: Any) -> None:
    """More sequences than max_num_seqs (4), of different prompt and answer lengths: they join and leave the running
    batch at different steps (their cache slots are reused and moved), and each answer is model.generate's alone."""
    jobs = [("a", 30), ("request number 1 says", 7), ("x" * 50 + " and so", 22), ("Hello there", 13), ("go", 26),
            ("abc def ghi", 4), ("the end is near, " * 3, 17)]

    async def run() -> list[str]:
        async with _async_client(server) as client:
            return await asyncio.gather(*(_stream(client, prompt, max_tokens) for prompt, max_tokens in jobs))

    before = max((engine.largest_batch for engine in ENGINES), default=0)
    assert asyncio.run(run()) == [reference(prompt, max_tokens) for prompt, max_tokens in jobs]
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


def _wait_idle() -> None:
    deadline = time.monotonic() + 10
    while not all(engine.idle for engine in ENGINES):
        assert time.monotonic() < deadline, "a sequence was not freed"
        time.sleep(0.01)


def test_a_client_that_leaves_frees_its_sequence_and_the_others_go_on(server: RunningServer, reference: Any) -> None:
    steps = sum(engine.steps for engine in ENGINES)

    async def leave(http: httpx.AsyncClient) -> None:
        # Triton's generate extension, so that the sampling parameters can say ignore_eos: 120 steps unless freed
        parameters = '{"max_tokens": 120, "ignore_eos": true, "temperature": 0.8}'
        async with http.stream("POST", f"http://{server.http_url}/v2/models/tiny/generate_stream", json={
                "text_input": "go", "stream": True, "sampling_parameters": parameters}) as answer:
            async for line in answer.aiter_lines():
                if line.startswith("data: "):
                    return  # closing the stream cancels the request

    async def run() -> tuple[str, None, str]:
        async with _async_client(server) as client, httpx.AsyncClient(timeout=60) as http:
            return await asyncio.gather(_stream(client, "Hello there", 40), leave(http), _stream(client, "abc", 35))

    first, _, last = asyncio.run(run())
    assert (first, last) == (reference("Hello there", 40), reference("abc", 35))
    _wait_idle()
    assert sum(engine.steps for engine in ENGINES) - steps < 100  # freed at once, not run to its 120 tokens


def test_an_empty_prompt_is_400_and_the_running_sequence_goes_on(server: RunningServer, reference: Any) -> None:
    async def run() -> tuple[httpx.Response, str]:
        async with _async_client(server) as client, httpx.AsyncClient(timeout=60) as http:
            stream = await client.completions.create(model="tiny", prompt="Hello there", max_tokens=50,
                                                     temperature=0, stream=True)
            pieces: list[str] = []
            empty = None
            async for chunk in stream:
                pieces.append(chunk.choices[0].text)
                if empty is None:  # while the first sequence is running
                    empty = await http.post(f"http://{server.http_url}/v2/models/tiny/generate", json={
                        "text_input": "", "sampling_parameters": '{"max_tokens": 5}'})
            assert empty is not None
            return empty, "".join(pieces)

    empty, text = asyncio.run(run())
    assert empty.status_code == 400 and "The decoder prompt cannot be empty" in empty.json()["error"]
    assert text == reference("Hello there", 50)
    client = openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="", max_tokens=5)


def _generate(server: RunningServer, model: str, prompt: str, **sampling: Any) -> dict[str, Any]:
    answer = httpx.post(f"http://{server.http_url}/v2/models/{model}/generate", timeout=60, json={
        "text_input": prompt, "sampling_parameters": json.dumps(sampling), "return_finish_reason": True,
        "return_num_output_tokens": True, "return_logprobs": True})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_min_tokens_and_ignore_eos(server: RunningServer, reference: Any, stop_token: int) -> None:
    """Model ``stops`` ends STOPS_PROMPT's greedy answer at its second token; min_tokens holds its end-of-sequence
    tokens back, ignore_eos generates through them (vLLM's meanings)."""
    stops = [reference.tokenizer.eos_token_id, stop_token]
    plain = _generate(server, "stops", STOPS_PROMPT, max_tokens=12, temperature=0)
    expected = reference.ids(STOPS_PROMPT, 12, eos_token_id=stops)
    assert plain["text_output"] == reference.tokenizer.decode(expected) and len(expected) < 6
    assert (plain["finish_reason"], plain["num_output_tokens"]) == ("stop", len(expected))
    held = _generate(server, "stops", STOPS_PROMPT, max_tokens=12, temperature=0, min_tokens=6)
    expected = reference.ids(STOPS_PROMPT, 12, eos_token_id=stops, min_new_tokens=6)
    assert held["text_output"] == reference.tokenizer.decode(expected) and held["num_output_tokens"] >= 6
    through = _generate(server, "stops", STOPS_PROMPT, max_tokens=12, temperature=0, ignore_eos=True)
    expected = reference.ids(STOPS_PROMPT, 12)  # model tiny: the same weights, only the usual end-of-sequence token
    assert len(expected) == 12 and stop_token in expected
    assert through["text_output"] == reference.tokenizer.decode(expected)
    assert (through["finish_reason"], through["num_output_tokens"]) == ("length", 12)
    # a stop string is looked for only after the first min_tokens tokens (vLLM's order of checks)
    full = reference("abc", 20)
    stop = full[1]
    cut = _generate(server, "tiny", "abc", max_tokens=20, temperature=0, min_tokens=5, stop=[stop])
    at = full.find(stop, 5)  # one character per token here
    assert cut["text_output"] == (full if at < 0 else full[:at])


def test_logprobs_name_the_sampled_token_first(server: RunningServer, reference: Any) -> None:
    """Each token's entry lists the sampled token first (with its rank), then exactly the k most likely: the first
    keys spell the text, also when sampling chose a token that is not the most likely."""
    answer = _generate(server, "tiny", "abc", max_tokens=24, temperature=3.0, seed=5, logprobs=2)
    entries = json.loads(answer["logprobs"])
    assert len(entries) == answer["num_output_tokens"] == 24
    sampled = [next(iter(entry.items())) for entry in entries]
    assert "".join(reference.tokenizer.decode([int(token)]) for token, _ in sampled) == answer["text_output"]
    assert "".join(item["decoded_token"] for _, item in sampled) == answer["text_output"]
    for entry, (token, item) in zip(entries, sampled):
        top = sorted(entry.values(), key=lambda candidate: candidate["rank"])
        top = [candidate for candidate in top if candidate["rank"] <= 2]
        assert [candidate["rank"] for candidate in top] == [1, 2]
        assert top[0]["logprob"] >= top[1]["logprob"] >= (item["logprob"] if item["rank"] > 2 else -math.inf)
        assert len(entry) == (2 if item["rank"] <= 2 else 3)
    assert any(item["rank"] > 1 for _, item in sampled)  # sampling did choose less likely tokens


def test_best_of_and_bad_min_tokens_are_refused(server: RunningServer) -> None:
    for sampling, message in (({"best_of": 2}, "unknown sampling parameters: best_of"),
                              ({"min_tokens": 5, "max_tokens": 2},
                               "min_tokens must be less than or equal to max_tokens=2, got 5."),
                              ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1.")):
        answer = httpx.post(f"http://{server.http_url}/v2/models/tiny/generate", timeout=30, json={
            "text_input": "hi", "sampling_parameters": json.dumps(sampling)})
        assert answer.status_code == 400 and message in answer.json()["error"]


def test_generation_metrics(server: RunningServer, client: openai.OpenAI) -> None:
    client.completions.create(model="tiny", prompt="count me", max_tokens=4, temperature=0)
    text = httpx.get(f"http://127.0.0.1:{server.options.metrics_port}/metrics", timeout=10).text
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("tserve_llm_")}
    labels = '{model="tiny",version="1"}'
    assert values[f"tserve_llm_time_to_first_token_ms_count{labels}"] >= 1
    assert values[f"tserve_llm_inter_token_latency_ms_count{labels}"] >= 1
    assert values[f"tserve_llm_generated_tokens_total{labels}"] >= 2
    assert values[f"tserve_llm_running_sequences{labels}"] == 0  # the finished sequence left


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
