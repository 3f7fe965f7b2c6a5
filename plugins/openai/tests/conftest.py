"""A server with two Python LLM models, one per Triton tensor contract, and a tokenizer directory with a chat
template; in both front-end modes."""
from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from triton_serve.plugin import OpenAIOptions, ServerOptions
from triton_serve.testing import RunningServer, free_port

MODEL_PY = (Path(__file__).parent / "llm_model.py").read_text()
MAX_TOOL_CALL_PARSE_BYTES = 600  # --max-tool-call-parse-bytes of the shared server

VLLM_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_finish_reason" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_logprobs" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "num_input_tokens" data_type: TYPE_UINT32 dims: [ 1 ] },
  { name: "num_output_tokens" data_type: TYPE_UINT32 dims: [ 1 ] },
  { name: "finish_reason" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "logprobs" data_type: TYPE_STRING dims: [ -1 ] }
]
parameters { key: "tokenizer" value: { string_value: "%s" } }
"""

# TensorRT-LLM's ensemble inputs (a batching model: every tensor gets a batch dimension).
TRTLLM_CONFIG = """
backend: "python"
max_batch_size: 4
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "stop_words" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "num_input_tokens" data_type: TYPE_UINT32 dims: [ 1 ] },
  { name: "num_output_tokens" data_type: TYPE_UINT32 dims: [ 1 ] }
]
"""

# The vLLM backend's embedding contract: the embedding of a text is [characters, words, 0.5, ...] cut to the
# requested dimensions (default 3), its token count the words.
EMBED_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "embedding_request" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "num_input_tokens" data_type: TYPE_UINT32 dims: [ 1 ] }
]
"""

EMBED_MODEL_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            asked = json.loads(pb_utils.get_input_tensor_by_name(request, "embedding_request").as_numpy()[0])
            text = asked["input"] if isinstance(asked["input"], str) else " ".join(map(str, asked["input"]))
            if text == "fail":
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("cannot embed that")))
                continue
            size = asked["pooling_params"].get("dimensions", [3])[0]
            vector = ([float(len(text)), float(len(text.split()))] + [0.5] * size)[:size]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([json.dumps(vector).encode()], dtype=np.object_)),
                pb_utils.Tensor("num_input_tokens", np.array([len(text.split())], dtype=np.uint32))]))
        return responses
"""

# A chat template in the style of Hugging Face tokenizers: special tokens, roles, a refusal of unknown orders, and
# tools (their names first; an assistant's calls and a tool's answer in their turns).
CHAT_TEMPLATE = ("{{ bos_token }}{% if tools %}<|tools|> {% for tool in tools %}{{ tool['function']['name'] }} "
                 "{% endfor %}{% endif %}{% for message in messages %}"
                 "{% if message['role'] == 'assistant' and loop.first %}"
                 "{{ raise_exception('the conversation must not start with the assistant') }}{% endif %}"
                 "<|{{ message['role'] }}|> {{ message['content'] }} "
                 "{% for call in message['tool_calls'] or [] %}<|call|> {{ call['function']['name'] }} "
                 "{{ call['function']['arguments'] }} {% endfor %}"
                 "{% if message['tool_call_id'] %}<|for|> {{ message['tool_call_id'] }} {% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


# The tokenizer's words: one token each (whitespace splits), anything else [UNK]; <s> opens a prompt.
VOCABULARY = ["[UNK]", "<s>", "</s>", "hello", "there", "world", "a", "b", "c", "<|user|>", "<|assistant|>"]


def _write_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordLevel({word: index for index, word in enumerate(VOCABULARY)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.add_special_tokens(["<s>", "</s>", "<|user|>", "<|assistant|>"])  # found inside words too
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "config.json").write_text(json.dumps({"max_position_embeddings": 300}))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>",
         "unk_token": "[UNK]",
         "tokenizer_class": "PreTrainedTokenizerFast"}))


def write_repository(root: Path) -> Path:
    tokenizer = root / "tokenizer"
    tokenizer.mkdir(parents=True)
    _write_tokenizer(tokenizer)
    repo = root / "models"
    for name, config in (("llm_vllm", VLLM_CONFIG % tokenizer), ("llm_trtllm", TRTLLM_CONFIG)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL_PY)
        (repo / name / "config.pbtxt").write_text(config)
    (repo / "embedder" / "1").mkdir(parents=True)
    (repo / "embedder" / "1" / "model.py").write_text(EMBED_MODEL_PY)
    (repo / "embedder" / "config.pbtxt").write_text(EMBED_CONFIG)
    return repo


@pytest.fixture(scope="module", params=[0, 2], ids=["in-process-frontends", "frontend-processes"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = write_repository(tmp_path_factory.mktemp("openai"))
    prefix = f"tso_{os.getpid()}_{uuid.uuid4().hex[:6]}_"
    running = RunningServer(ServerOptions(
        model_repositories=[str(repo)], http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
        http_address="127.0.0.1", grpc_address="127.0.0.1", metrics_address="127.0.0.1",
        frontend_processes=request.param, model_control_mode="explicit", load_models=["*"],
        openai=OpenAIOptions(tool_call_parser="llama3", max_tool_call_parse_bytes=MAX_TOOL_CALL_PARSE_BYTES),
        backend_config={"python": {"shm-region-prefix-name": prefix}}))
    yield running
    running.stop()


@pytest.fixture
def base_url(server: RunningServer) -> str:
    return f"http://{server.http_url}/v1"


@pytest.fixture(params=["llm_vllm", "llm_trtllm"])
def model(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _expected_prompt(messages: list[dict[str, str]], model: str) -> str:
    if model == "llm_vllm":
        return "<s>" + "".join(f"<|{m['role']}|> {m['content']} " for m in messages) + "<|assistant|>"
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _reply_to(prompt: str, max_tokens: int = 16) -> str:
    return "".join(word + " " for word in list(reversed(prompt.split()))[:max_tokens])


@pytest.fixture(scope="session")
def expected_prompt() -> Callable[[list[dict[str, str]], str], str]:
    """``expected_prompt(messages, model)``: the prompt each test model's chat template makes of ``messages``."""
    return _expected_prompt


@pytest.fixture(scope="session")
def reply_to() -> Callable[..., str]:
    """``reply_to(prompt, max_tokens=16)``: what the test models answer, the prompt's words backwards."""
    return _reply_to


@pytest.fixture(scope="session")
def llm_repository() -> Callable[[Path], Path]:
    """``llm_repository(root)``: writes the two test models and their tokenizer under ``root``; the models'
    directory."""
    return write_repository
