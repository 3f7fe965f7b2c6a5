"""The SageMaker and Vertex AI listeners, called as those platforms call them (plain HTTP), in both front-end modes."""
from __future__ import annotations

import asyncio
import json
import struct

import httpx
import numpy as np
import pytest

from .conftest import FRONTEND_MODES
from triton_serve._engine.cli import build_parser, options_from_args
from triton_serve._engine.errors import ServerError
from triton_serve._engine.frontend.platforms.listeners import PlatformOptions
from triton_serve._engine.frontend.platforms.sagemaker import SageMakerSettings, sagemaker_app
from triton_serve.testing import free_port

IDENTITY = ('backend: "toy_identity"\nmax_batch_size: 0\n'
            'input { name: "INPUT0" data_type: TYPE_FP32 dims: [2] }\n'
            'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }')
BODY = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.5, -2.0]}]}
SAGEMAKER_BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="
VERTEX_BINARY = "application/vnd.vertex-ai-triton.binary+json;json-header-size="


@pytest.fixture(params=FRONTEND_MODES)
def frontend_processes(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def _binary_request(mime: str, binary_output: bool) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 8}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": binary_output}}]}).encode()
    return header + struct.pack("<2f", 3.0, 4.5), {"Content-Type": f"{mime}{len(header)}"}


def test_sagemaker_ping_invocations_and_multi_model_routes(add_model, toy_server,  # type: ignore[no-untyped-def]
                                                          monkeypatch) -> None:
    monkeypatch.setenv("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "ident")
    add_model("ident", IDENTITY)
    port = free_port()
    server = toy_server(platforms=PlatformOptions(sagemaker_port=port, sagemaker_default_model="ident"))
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=30) as client:
        assert client.get("/ping").status_code == 200
        answer = client.post("/invocations", json=BODY)
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/json"
        assert answer.json()["outputs"][0]["data"] == [1.5, -2.0]
        # binary tensors: the JSON header's size travels in SageMaker's MIME type, both ways
        body, headers = _binary_request(SAGEMAKER_BINARY, binary_output=True)
        answer = client.post("/invocations", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
        size = int(answer.headers["content-type"].removeprefix(SAGEMAKER_BINARY))
        assert json.loads(answer.content[:size])["model_name"] == "ident"
        assert struct.unpack("<2f", answer.content[size:]) == (3.0, 4.5)
        bad = client.post("/invocations", content=body, headers={"Content-Type": "text/plain;" + headers[
            "Content-Type"]})
        assert bad.status_code == 400 and "expect MIME type for binary data starts with" in bad.json()["error"]
        # the multi-model routes: nothing registered, so each answers as for a model not loaded
        assert client.get("/models").json() == {"models": []}
        assert client.get("/models/m1").status_code == 404
        assert client.post("/models/m1/invoke", json=BODY).status_code == 404
        assert client.delete("/models/m1").status_code == 404
        assert client.get("/nowhere").status_code == 400
    assert httpx.get(f"http://{server.http_url}/v2/health/ready").status_code == 200  # KServe v2 serves too


def test_sagemaker_invocations_of_a_missing_default_model(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("ident", IDENTITY)
    port = free_port()
    server = toy_server(platforms=PlatformOptions(sagemaker_port=port))  # SAGEMAKER_TRITON_DEFAULT_MODEL_NAME unset
    answer = httpx.post(f"http://127.0.0.1:{port}/invocations", json=BODY, timeout=30)
    direct = httpx.post(f"http://{server.http_url}/v2/models/unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME/infer",
                        json=BODY, timeout=30)
    assert answer.status_code == direct.status_code >= 400  # as the HTTP front-end answers an unknown model
    assert "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" in answer.json()["error"]


def test_sagemaker_inference_type_generate_stream(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("ident", IDENTITY)  # SAGEMAKER_TRITON_INFERENCE_TYPE=generate_stream (Triton 2.56)
    port = free_port()
    toy_server(platforms=PlatformOptions(sagemaker_port=port, sagemaker_default_model="ident",
                                         sagemaker_inference_type="generate_stream"))
    answer = httpx.post(f"http://127.0.0.1:{port}/invocations", json={"INPUT0": [1.5, -2.0]}, timeout=30)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    assert answer.text == 'data: {"OUTPUT0":[1.5,-2.0],"model_name":"ident","model_version":"1"}\n\n'


@pytest.mark.parametrize("kind", ["infer", "generate", "generate_stream", "incorrect_inference_type"])
def test_sagemaker_inference_type_picks_what_invocations_runs(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGEMAKER_TRITON_INFERENCE_TYPE", kind)
    assert SageMakerSettings.from_environment().inference_type == kind

    async def triton(scope, receive, send):  # type: ignore[no-untyped-def]  # the KServe v2 app: echoes the path
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": scope["path"].encode()})

    async def call() -> httpx.Response:
        app = sagemaker_app(None, triton, SageMakerSettings("m", "ready", kind))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sm") as client:
            return await client.post("/invocations", json={})
    answer = asyncio.run(call())
    if kind == "incorrect_inference_type":
        assert answer.status_code == 500
        assert answer.json() == {"error": "Server has invalid inference type 'incorrect_inference_type'. Must be one "
                                          "of: infer, generate, generate_stream."}
    else:
        assert answer.text == f"/v2/models/m/{kind}"


def _vertex(port: int, default_model: str = "") -> PlatformOptions:
    return PlatformOptions(vertex_ai_port=port, vertex_ai_predict_route="/v1/endpoints/e/deployedModels/d:predict",
                           vertex_ai_health_route="/v1/endpoints/e/deployedModels/d", vertex_ai_default_model=default_model)


def test_vertex_ai_predict_health_and_redirect(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("ident", IDENTITY)
    port = free_port()
    # AIP_MODE=PREDICTION's defaults: only the Vertex AI listener serves
    toy_server(platforms=_vertex(port), allow_http=False, allow_grpc=False)
    predict = "/v1/endpoints/e/deployedModels/d:predict"
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        assert client.get("/v1/endpoints/e/deployedModels/d").status_code == 200
        answer = client.post(predict, json=BODY)  # the repository's only model is the default
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [1.5, -2.0]
        body, headers = _binary_request(VERTEX_BINARY, binary_output=False)
        answer = client.post(predict, content=body, headers=headers)
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [3.0, 4.5]
        redirect = "X-Vertex-Ai-Triton-Redirect"
        config = client.post(predict, headers={redirect: "v2/models/ident/config"})
        assert config.status_code == 200 and config.json()["name"] == "ident"
        assert client.post(predict, headers={redirect: "v2/health/ready"}).status_code == 200
        answer = client.post(predict, json=BODY, headers={redirect: "v2/models/ident/versions/1/infer"})
        assert answer.status_code == 200 and answer.json()["model_version"] == "1"
        index = client.post(predict, json={}, headers={redirect: "v2/repository/index"})
        assert [entry["name"] for entry in index.json()] == ["ident"]
        missing = client.post(predict, headers={redirect: "v2/models/nothing/ready"})
        assert missing.status_code == 400
        assert client.post(predict, headers={redirect: "v2/unknown"}).status_code == 400
        assert client.get(predict, headers={redirect: "v2"}).status_code == 405
        assert client.post("/elsewhere", json=BODY).status_code == 400
        metrics = client.post(predict, headers={redirect: "metrics"})  # the metrics port's text, as in Triton
        assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert 'nv_inference_request_success{model="ident",version="1"} 3\n' in metrics.text


@pytest.mark.parametrize("frontend_processes", [1])
def test_vertex_ai_redirect_to_metrics_with_metrics_off(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("ident", IDENTITY)
    port = free_port()
    toy_server(platforms=_vertex(port), allow_metrics=False)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        answer = client.post("/v1/endpoints/e/deployedModels/d:predict",
                             headers={"X-Vertex-Ai-Triton-Redirect": "metrics"})
        assert answer.status_code == 400 and answer.content == b""


@pytest.mark.parametrize("frontend_processes", [0])
def test_vertex_ai_default_model_must_be_loaded(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("a", IDENTITY)
    add_model("b", IDENTITY)
    with pytest.raises(ServerError, match="Expect the model repository contains only a single model"):
        toy_server(platforms=_vertex(free_port()))
    with pytest.raises(ServerError, match="Expect the default model 'c' is loaded"):
        toy_server(platforms=_vertex(free_port(), "c"))


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HTTP_PORT", "9123")
    monkeypatch.delenv("AIP_PREDICT_ROUTE", raising=False)
    args = build_parser().parse_args([])
    assert (args.allow_http, args.allow_grpc) == (False, False)
    with pytest.raises(ServerError, match="API_PREDICT_ROUTE is not defined for Vertex AI endpoint"):
        options_from_args(args)
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/predict")
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/health")
    platforms = options_from_args(args).platforms
    assert (platforms.vertex_ai_port, platforms.vertex_ai_predict_route) == (9123, "/predict")
    monkeypatch.delenv("AIP_MODE")
    args = build_parser().parse_args(["--allow-sagemaker", "true", "--sagemaker-port", "8000"])
    with pytest.raises(ServerError, match="cannot listen to HTTP requests and SageMaker requests at the same"):
        options_from_args(args)
    args = build_parser().parse_args(["--allow-sagemaker=true", "--sagemaker-safe-port-range", "8080-8090"])
    with pytest.raises(ServerError, match=r"cannot listen to HTTP requests at port 8000, allowed port range is "
                                          r"\[8080, 8090\]"):
        options_from_args(args)
