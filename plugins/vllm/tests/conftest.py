"""One server with one vLLM engine for the whole test session (its start takes about a minute): a tiny random-weight
Llama made here (nothing is downloaded), served by the vllm backend with two LoRA adapters made here too, with the
OpenAI front-end on the HTTP port. The repository also holds ``embed``, the same weights on vLLM's pooling runner,
which test_vllm_embeddings.py loads (a second engine) and unloads."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from triton_serve.plugin import OpenAIOptions, ServerOptions
from triton_serve.testing import RunningServer, free_port
from triton_serve_vllm.engine_client import ENGINES, EngineClient

MODEL = "llm"
EMBED_MODEL = "embed"  # the same weights on vLLM's pooling runner (test_vllm_embeddings.py)
LORA_RANK = 8
LORAS = ("alpha", "beta")  # multi_lora.json's: alpha by a path relative to the version directory, beta absolute
MAX_MODEL_LEN = 8192  # room for long generations (seconds): a cancelled one still runs when its abort comes
# Each engine's key-value cache (vLLM's default on CPUs is GiBs): MODEL's holds its 8 sequences of MAX_MODEL_LEN
# tokens (512 bytes a token) twice over; EMBED_MODEL's its 4 of 512.
KV_CACHE_BYTES = {MODEL: 64 << 20, EMBED_MODEL: 8 << 20}
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


def make_lora_adapter(directory: Path, weights: Path, seed: int) -> Path:
    """A PEFT LoRA adapter (``adapter_config.json``, ``adapter_model.safetensors``) of rank ``LORA_RANK`` on the
    attention's q and v projections of the model in ``weights``, with random weights large enough to change its
    greedy output."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((weights / "config.json").read_text())
    outputs = {"q_proj": config["num_attention_heads"] * config["head_dim"],
               "v_proj": config["num_key_value_heads"] * config["head_dim"]}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, width in outputs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(LORA_RANK, config["hidden_size"], generator=generator)
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(width, LORA_RANK, generator=generator)
    directory.mkdir(parents=True)
    save_file(tensors, directory / "adapter_model.safetensors")
    (directory / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(weights), "r": LORA_RANK,
         "lora_alpha": 2 * LORA_RANK, "target_modules": list(outputs), "bias": "none"}))
    return directory


def write_repository(root: Path) -> Path:
    repo = root / "models"
    version = repo / MODEL / "1"
    version.mkdir(parents=True)
    weights = make_weights(version / "weights")  # a relative "model" in model.json: found under the version directory
    make_lora_adapter(version / "adapters" / "alpha", weights, seed=1)
    beta = make_lora_adapter(root / "adapters" / "beta", weights, seed=2)
    (version / "multi_lora.json").write_text(json.dumps({"alpha": "adapters/alpha", "beta": str(beta)}))
    (repo / MODEL / "config.pbtxt").write_text(
        'backend: "vllm"\ninstance_group [ { count: 1 kind: KIND_MODEL } ]\n'
        'parameters: { key: "REPORT_CUSTOM_METRICS" value: { string_value: "true" } }\n')
    (version / "model.json").write_text(json.dumps(
        {"model": "weights", "max_model_len": MAX_MODEL_LEN, "dtype": "float32", "enforce_eager": True,
         "max_num_seqs": 8, "kv_cache_memory_bytes": KV_CACHE_BYTES[MODEL], "enable_lora": True,
         "max_lora_rank": LORA_RANK, "max_loras": len(LORAS)}))
    embed = repo / EMBED_MODEL / "1"
    embed.mkdir(parents=True)
    (repo / EMBED_MODEL / "config.pbtxt").write_text(
        'backend: "vllm"\ninstance_group [ { count: 1 kind: KIND_MODEL } ]\n')
    # vLLM's pooling runner makes the causal LM an embedding model (last token pooled, normalized); the config's
    # is_matryoshka lets a request cut the vector to its first ``dimensions``
    (embed / "model.json").write_text(json.dumps(
        {"model": str(weights), "runner": "pooling", "max_model_len": 512, "dtype": "float32", "enforce_eager": True,
         "max_num_seqs": 4, "kv_cache_memory_bytes": KV_CACHE_BYTES[EMBED_MODEL],
         "hf_overrides": {"is_matryoshka": True}}))
    (repo / "no_model_json" / "1").mkdir(parents=True)
    (repo / "no_model_json" / "config.pbtxt").write_text('backend: "vllm"\n')
    return repo


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
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


@pytest.fixture
def engine(server: RunningServer) -> EngineClient:
    """The running engine of ``MODEL`` (the embedding model's, when loaded, is another)."""
    (running,) = [engine for engine in ENGINES
                  if engine.dead is None and engine.label.startswith(f"vLLM model '{MODEL}' ")]
    return running
