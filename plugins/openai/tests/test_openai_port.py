"""``--openai-port`` and ``--openai-restricted-api``: /v1 alone on its own port, and Triton's header rule per API
group, on both ports and in both front-end modes."""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from triton_serve.plugin import OpenAIOptions, ServerOptions
from triton_serve.testing import RunningServer, free_port

INFER = {"infer-key": "infer-secret"}
LIST = {"model-key": "model-secret"}
METRICS = {"metrics-key": "metrics-secret"}
MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module", params=[0, 2], ids=["in-process-frontends", "frontend-processes"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           llm_repository: Callable[[Path], Path]) -> Iterator[RunningServer]:
    repo = llm_repository(tmp_path_factory.mktemp("openai_port"))
    prefix = f"tsop_{os.getpid()}_{uuid.uuid4().hex[:6]}_"
    restricted = {"inference": ("infer-key", "infer-secret"), "model-repository": ("model-key", "model-secret"),
                  "metrics": ("metrics-key", "metrics-secret")}
    running = RunningServer(ServerOptions(
        model_repositories=[str(repo)], http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
        http_address="127.0.0.1", grpc_address="127.0.0.1", metrics_address="127.0.0.1",
        frontend_processes=request.param, openai=OpenAIOptions(free_port(), restricted), http_max_input_size=4096,
        backend_config={"python": {"shm-region-prefix-name": prefix}}))
    yield running
    running.stop()


def _urls(server: RunningServer) -> list[str]:
    assert server.options.openai.port is not None
    return [f"http://127.0.0.1:{server.options.openai.port}/v1", f"http://{server.http_url}/v1"]


def test_the_openai_port_serves_v1_alone(server: RunningServer) -> None:
    openai_url, _http_url = _urls(server)
    client = openai.OpenAI(base_url=openai_url, api_key="unused", max_retries=0, timeout=30, default_headers=INFER)
    answer = client.chat.completions.create(model="llm_vllm", messages=MESSAGES)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "<|assistant|> there hello <s><|user|> "
    root = openai_url.removesuffix("/v1")
    assert httpx.get(f"{root}/v2/health/ready", timeout=30).status_code == 404  # KServe v2 stays on the HTTP port
    assert httpx.get(f"http://{server.http_url}/v2/health/ready", timeout=30).status_code == 200


@pytest.mark.parametrize("port", ["openai", "http"])
def test_restricted_groups_need_their_header(server: RunningServer, port: str) -> None:
    url = _urls(server)[0 if port == "openai" else 1]
    bare = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as caught:
        bare.chat.completions.create(model="llm_vllm", messages=MESSAGES)  # type: ignore[arg-type]
    assert caught.value.status_code == 401
    assert caught.value.body == {"message": "This API is restricted, expecting header 'infer-key' with valid value",
                                 "type": "authentication_error", "code": "invalid_auth"}
    with pytest.raises(openai.AuthenticationError):  # a wrong value is refused too, and so is another group's key
        bare.completions.create(model="llm_vllm", prompt="a b", extra_headers={"infer-key": "nope", **LIST})
    with pytest.raises(openai.AuthenticationError, match="'model-key'"):
        bare.models.list(extra_headers=INFER)
    with pytest.raises(openai.AuthenticationError, match="'model-key'"):
        bare.models.retrieve("llm_vllm")
    assert bare.completions.create(model="llm_vllm", prompt="a b", extra_headers=INFER).choices[0].text == "b a "
    assert [model.id for model in bare.models.list(extra_headers=LIST).data] == ["embedder", "llm_trtllm", "llm_vllm"]
    embedding = {"model": "embedder", "input": "x"}  # embeddings are in the inference group
    assert httpx.post(f"{url}/embeddings", json=embedding, timeout=30).status_code == 401
    assert httpx.post(f"{url}/embeddings", json=embedding, headers=INFER, timeout=30).status_code == 200


def test_auto_tool_choice_needs_a_parser(server: RunningServer) -> None:
    body = {"model": "llm_vllm", "messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]}
    answer = httpx.post(f"{_urls(server)[0]}/chat/completions", json=body, headers=INFER, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == '"auto" tool choice requires --tool-call-parser to be set'


@pytest.mark.parametrize("port", ["openai", "http"])
def test_a_body_over_the_input_limit_is_413(server: RunningServer, port: str) -> None:
    url = _urls(server)[0 if port == "openai" else 1]
    body = {"model": "llm_vllm", "prompt": "w " * 3000}
    answer = httpx.post(f"{url}/completions", json=body, headers=INFER, timeout=30)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "content_too_large" and "--http-max-input-size" in answer.text


def test_health_and_metrics_on_the_openai_port(server: RunningServer) -> None:
    root = _urls(server)[0].removesuffix("/v1")
    ready = httpx.get(f"{root}/health/ready", timeout=30)
    assert ready.status_code == 200 and ready.content == b""
    assert httpx.post(f"{root}/health/ready", timeout=30).status_code == 405
    refused = httpx.get(f"{root}/metrics", timeout=30)  # the metrics group is restricted
    assert refused.status_code == 401 and "'metrics-key'" in refused.json()["error"]["message"]
    httpx.post(f"{root}/v1/completions", json={"model": "llm_vllm", "prompt": "count me"}, headers=INFER, timeout=30)
    metrics = httpx.get(f"{root}/metrics", headers=METRICS, timeout=30)
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert 'nv_inference_request_success{model="llm_vllm",version="1"}' in metrics.text
    assert httpx.get(f"{root}/v2/metrics", headers=METRICS, timeout=30).status_code == 404
    tokens = httpx.post(f"{root}/tokenize", json={"model": "llm_vllm", "prompt": "hello"}, timeout=60)
    assert tokens.status_code == 200 and tokens.json()["tokens"] == [1, 3]  # vLLM's /tokenize is served here too


@pytest.mark.parametrize("port", ["openai", "http"])
def test_model_control_is_restricted_and_needs_explicit_mode(server: RunningServer, port: str) -> None:
    url = _urls(server)[0 if port == "openai" else 1]
    for action in ("load", "unload"):
        refused = httpx.post(f"{url}/models/llm_vllm/{action}", timeout=30)
        assert refused.status_code == 401 and "'model-key'" in refused.json()["error"]["message"]
        answer = httpx.post(f"{url}/models/llm_vllm/{action}", headers=LIST, timeout=30)
        assert answer.status_code == 400  # this server does not load models explicitly
        assert answer.json()["error"]["message"] == "Model load/unload requires --model-control-mode=explicit"
