"""One server with one vLLM engine for the whole test session (its start takes about a minute): a tiny random-weight
Llama made here (nothing is downloaded), served by the vllm backend, with the OpenAI front-end on the HTTP port."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from triton_serve.plugin import OpenAIOptions, ServerOptions
from triton_serve.testing import RunningServer, free_port

MODEL = "llm"
MAX_MODEL_LEN = 8192  # room for long generations (seconds): a cancelled one still runs when its abort comes
LOAD_TIMEOUT_S = 900  # the engine's first start compiles; two busy cores are slow


def make_weights(directory: Path) -> Path:
    """The transformers plugin's tiny Llama and its character tokenizer, with 32-wide attention heads (the smallest
    vLLM's CPU attention takes), fp32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from triton_serve_transformers.tiny import make_tiny_llama

    make_tiny_llama(directory, context=MAX_MODEL_LEN)
    config = LlamaConfig.from_pretrained(directory)
    config.hidden_size, config.intermediate_size, config.head_dim = 64, 128, 32
    config.num_attention_heads, config.num_key_value_heads = 2, 1
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def write_repository(root: Path) -> Path:
    repo = root / "models"
    version = repo / MODEL / "1"
    version.mkdir(parents=True)
    make_weights(version / "weights")  # a relative "model" in model.json: found under the version directory
    (repo / MODEL / "config.pbtxt").write_text(
        'backend: "vllm"\ninstance_group [ { count: 1 kind: KIND_MODEL } ]\n'
        'parameters: { key: "REPORT_CUSTOM_METRICS" value: { string_value: "true" } }\n')
    (version / "model.json").write_text(json.dumps(
        {"model": "weights", "max_model_len": MAX_MODEL_LEN, "dtype": "float32", "enforce_eager": True,
         "max_num_seqs": 8}))
    (repo / "no_model_json" / "1").mkdir(parents=True)
    (repo / "no_model_json" / "config.pbtxt").write_text('backend: "vllm"\n')
    return repo


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the engine process inherits it
    repo = write_repository(tmp_path_factory.mktemp("vllm"))
    running = RunningServer(ServerOptions(
        model_repositories=[str(repo)], http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
        http_address="127.0.0.1", grpc_address="127.0.0.1", metrics_address="127.0.0.1",
        model_control_mode="explicit", openai=OpenAIOptions()))
    try:
        httpclient.InferenceServerClient(running.http_url, network_timeout=LOAD_TIMEOUT_S).load_model(MODEL)
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def http_url(server: RunningServer) -> str:
    return server.http_url
