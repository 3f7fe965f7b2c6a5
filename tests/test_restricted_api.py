"""Restricted APIs (--http-restricted-api, --grpc-restricted-protocol) and header forwarding
(--http/grpc-header-forward-pattern), as Triton 2.51 behaves, through tritonclient HTTP and gRPC, with
the front-ends in the model owner and in front-end processes, under uvicorn and hypercorn."""
from __future__ import annotations

import asyncio
import http.client
import json
import queue
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from starlette.routing import Route
from tritonclient.utils import InferenceServerException

from triton_serve._engine.cli import build_parser, options_from_args
from triton_serve._engine.errors import ServerError
from triton_serve._engine.frontend.frontends import FrontendOptions
from triton_serve._engine.frontend.http.app import INFER_PATH, HttpFrontend
from triton_serve._engine.frontend.http.generate import GENERATE_PATH
from triton_serve._engine.frontend.platforms.listeners import PlatformOptions
from triton_serve._engine.frontend.header_forwarding import HeaderForwarder, forward_pattern_regex
from triton_serve._engine.protos import grpc_service_pb2, health_pb2, health_pb2_grpc
from triton_serve._engine.frontend.restricted import (CATEGORIES, GRPC_HEADER_PREFIX, GRPC_METHOD_CATEGORIES,
                                                     RestrictionCheck, grpc_interceptors, http_category,
                                                     kserve_category, parse_restrictions)
from triton_serve._engine.server import Server, ServerOptions
from triton_serve.testing import RunningServer, ToyBackendsPlugin, free_port

pytest.importorskip("triton_serve_python")

# Triton's own L0_http / L0_grpc set-ups, plus trace and logging with the admin key.
HTTP_RESTRICTED = ["model-repository,trace,logging:admin-key=admin-value", "inference,metadata:infer-key=infer-value"]
GRPC_RESTRICTED = ["model-repository,trace,logging:admin-key=admin-value", "inference,health:infer-key=infer-value"]
# Each call gets a copy: tritonclient.http adds its own headers to the dict it is given.
HTTP_INFER_KEY = (("infer-key", "infer-value"),)
GRPC_INFER_KEY = ((GRPC_HEADER_PREFIX + "infer-key", "infer-value"),)
HTTP_REFUSED = "This API is restricted, expecting header 'infer-key'"
GRPC_REFUSED = "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
EXPLICIT_ONLY = "explicit model load / unload is not allowed if polling is enabled"

# Echoes request.parameters() (a JSON string) back as PARAMETERS.
ECHO_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "PARAMETERS", np.array([request.parameters().encode()], dtype=np.object_))])
                for request in requests]
"""
ECHO_CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module", params=[(0, "uvicorn"), (2, "uvicorn"), (2, "hypercorn")],
                ids=["in-process", "frontend-processes", "frontend-processes-hypercorn"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server per mode: restrictions on both protocols; HTTP forwards MY_HEADER.* (any case), gRPC
    forwards my_header.* and, case-sensitively, OTHER.*."""
    frontend_processes, http_server = request.param
    repo = tmp_path_factory.mktemp("restricted")
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    (repo / "echo" / "1" / "model.py").write_text(textwrap.dedent(ECHO_MODEL))
    running = RunningServer(ServerOptions(
        model_repositories=[str(repo)], http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
        http_address="127.0.0.1", grpc_address="127.0.0.1", allow_metrics=False,
        frontend_processes=frontend_processes, http_server=http_server,
        http_restricted_api=parse_restrictions("--http-restricted-api", HTTP_RESTRICTED, kind="api"),
        grpc_restricted_protocol=parse_restrictions("--grpc-restricted-protocol", GRPC_RESTRICTED, kind="protocol",
                                                    header_prefix=GRPC_HEADER_PREFIX),
        http_header_forward_pattern="MY_HEADER.*", grpc_header_forward_pattern="my_header.*|(?-i)OTHER.*"))
    yield running
    running.stop()


def _inputs(module: Any) -> list[Any]:
    tensor = module.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    return [tensor]


def _parameters(result: Any) -> dict[str, Any]:
    return json.loads(result.as_numpy("PARAMETERS")[0])


def _raw_http(server: RunningServer, method: str, path: str, headers: dict[str, str] | None = None,
              body: bytes | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(server.http_url, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# ---- HTTP ----------------------------------------------------------------------------------------

def test_http_restricted_apis_need_their_header(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException, match=HTTP_REFUSED) as refused:
            client.get_server_metadata()
        assert refused.value.status() == "403"
        assert client.get_server_metadata(headers=dict(HTTP_INFER_KEY))["name"] == "triton"
        with pytest.raises(InferenceServerException, match=HTTP_REFUSED):
            client.get_model_metadata("echo", headers={"infer-key": "wrong-value"})
        assert client.get_model_metadata("echo", headers=dict(HTTP_INFER_KEY))["name"] == "echo"

        with pytest.raises(InferenceServerException, match=HTTP_REFUSED):
            client.infer("echo", _inputs(httpclient), headers={"test": "1"})
        assert "PARAMETERS" in [o["name"] for o in client.infer(
            "echo", _inputs(httpclient), headers=dict(HTTP_INFER_KEY)).get_response()["outputs"]]

        # model-repository wants the admin key; with it, the call reaches the repository and gets its own error
        with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
            client.unload_model("echo", headers=dict(HTTP_INFER_KEY))
        with pytest.raises(InferenceServerException, match=EXPLICIT_ONLY):
            client.unload_model("echo", headers={"admin-key": "admin-value"})

        # categories nobody restricted answer without any header
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("echo")
        assert client.get_model_config("echo")["name"] == "echo"
        assert client.get_inference_statistics("echo")["model_stats"][0]["name"] == "echo"
        assert client.get_system_shared_memory_status() == []
    finally:
        client.close()


def test_http_refusal_comes_first_with_tritons_status_and_body(server: RunningServer) -> None:
    assert _raw_http(server, "GET", "/v2") == (403, json.dumps({"error": HTTP_REFUSED}).encode())
    # the check runs before the method check, as in Triton
    assert _raw_http(server, "GET", "/v2/models/echo/infer")[0] == 403
    assert _raw_http(server, "GET", "/v2/models/echo/infer", dict(HTTP_INFER_KEY))[0] == 405
    # header names are case-insensitive; the value must match exactly
    assert _raw_http(server, "GET", "/v2", {"Infer-Key": "infer-value"})[0] == 200
    assert _raw_http(server, "GET", "/v2", {"infer-key": "INFER-VALUE"})[0] == 403
    # endpoints of restricted categories are refused whether or not they are served
    for path in ("/v2/trace/setting", "/v2/models/echo/trace/setting", "/v2/logging"):
        status, body = _raw_http(server, "POST", path, body=b"{}")
        assert (status, json.loads(body)) == (403, {"error": "This API is restricted, expecting header 'admin-key'"})


def test_http_connection_serves_on_after_a_refused_request_with_a_body(server: RunningServer) -> None:
    connection = http.client.HTTPConnection(server.http_url, timeout=30)
    try:
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
        connection.request("POST", "/v2/models/echo/infer", body=body)
        refused = connection.getresponse()
        assert (refused.status, json.loads(refused.read())) == (403, {"error": HTTP_REFUSED})
        connection.request("POST", "/v2/models/echo/infer", body=body, headers=dict(HTTP_INFER_KEY))
        answered = connection.getresponse()
        assert (answered.status, json.loads(answered.read())["outputs"][0]["name"]) == (200, "PARAMETERS")
    finally:
        connection.close()


def test_http_infer_taken_straight_from_the_parser_meets_the_same_check(server: RunningServer) -> None:
    """POST /infer is answered by the fast protocol when allowed; the first header of the name decides there as on
    every other route."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode()
    connection = http.client.HTTPConnection(server.http_url, timeout=30)
    try:
        for values, status in ((["wrong", "infer-value"], 403), (["infer-value", "wrong"], 200)):
            connection.putrequest("POST", "/v2/models/echo/infer")
            for value in values:
                connection.putheader("Infer-Key", value)
            connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
            answer = connection.getresponse()
            document = json.loads(answer.read())
            assert answer.status == status, values
            if status == 403:
                assert document == {"error": HTTP_REFUSED}
            else:
                assert document["model_name"] == "echo" and document["outputs"][0]["name"] == "PARAMETERS"
    finally:
        connection.close()


# ---- gRPC ----------------------------------------------------------------------------------------

def test_grpc_restricted_protocols_need_their_metadata(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match=GRPC_REFUSED) as refused:
            client.is_server_live()
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert client.is_server_live(headers=dict(GRPC_INFER_KEY))
        assert client.is_model_ready("echo", headers=dict(GRPC_INFER_KEY))
        with pytest.raises(InferenceServerException, match=GRPC_REFUSED):  # the key needs Triton's prefix
            client.is_server_ready(headers=dict(HTTP_INFER_KEY))

        with pytest.raises(InferenceServerException, match=GRPC_REFUSED):
            client.infer("echo", _inputs(grpcclient))
        answer = client.infer("echo", _inputs(grpcclient), headers=dict(GRPC_INFER_KEY))
        assert answer.as_numpy("PARAMETERS").shape == (1,)

        with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-admin-key'"):
            client.unload_model("echo", headers=dict(GRPC_INFER_KEY))
        with pytest.raises(InferenceServerException, match=EXPLICIT_ONLY):
            client.unload_model("echo", headers={GRPC_HEADER_PREFIX + "admin-key": "admin-value"})
        for call in (client.get_trace_settings, client.get_log_settings):
            with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-admin-key'"):
                call()

        # metadata is restricted on HTTP only
        assert client.get_server_metadata().name == "triton"
        assert client.get_model_config("echo").config.name == "echo"
    finally:
        client.close()


def test_grpc_health_service_is_in_the_health_category(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        with pytest.raises(grpc.RpcError) as refused:
            check(health_pb2.HealthCheckRequest())
        assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.UNAVAILABLE, GRPC_REFUSED)
        answer = check(health_pb2.HealthCheckRequest(), metadata=GRPC_INFER_KEY)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refused:
            next(health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest()))
        assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.UNAVAILABLE, GRPC_REFUSED)


def _stream_answer(client: grpcclient.InferenceServerClient, headers: dict[str, str] | None,
                   send: bool = True) -> tuple[Any, Any]:
    """The first (result, error) a stream's callback gets, after sending one request when ``send``."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
    try:
        if send:
            client.async_stream_infer("echo", _inputs(grpcclient))
        return answers.get(timeout=60)
    finally:
        client.stop_stream()


def test_grpc_stream_is_restricted_and_forwards_its_metadata(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result, error = _stream_answer(client, None, send=False)  # refused as it opens, as in Triton
        assert result is None and error.message() == GRPC_REFUSED
        result, error = _stream_answer(client, {**dict(GRPC_INFER_KEY), "my_header_1": "stream value",
                                                 "header_2": "x"})
        assert error is None
        forwarded = _parameters(result)
        assert forwarded["my_header_1"] == "stream value" and "header_2" not in forwarded
    finally:
        client.close()


# ---- header forwarding -----------------------------------------------------------------------------

def test_http_forwarded_headers_reach_the_model_in_any_case(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        headers = {**dict(HTTP_INFER_KEY), "my_header_1": "my_value_1", "My-Header-2": "ignored: no match",
                   "My_Header_3": 'a "quoted" value', "header_4": "value_4"}
        parameters = _parameters(client.infer("echo", _inputs(httpclient), headers=headers,
                                              parameters={"key1": "value1"}))
    finally:
        client.close()
    assert parameters["key1"] == "value1"
    # MY_HEADER.* matches in any case; HTTP header names arrive lower-cased
    assert {k: v for k, v in parameters.items() if "header" in k} == {
        "my_header_1": "my_value_1", "my_header_3": 'a "quoted" value'}


def test_grpc_forwarded_metadata_reaches_the_model_and_honours_case(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        headers = {**dict(GRPC_INFER_KEY), "my_header_1": "my_value_1", "other_header": "lower case misses (?-i)OTHER",
                   "header_3": "value_3"}
        parameters = _parameters(client.infer("echo", _inputs(grpcclient), headers=headers,
                                              parameters={"key1": "value1"}))
    finally:
        client.close()
    assert parameters["key1"] == "value1"
    assert {k: v for k, v in parameters.items() if "header" in k} == {"my_header_1": "my_value_1"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_forwarding_a_reserved_name_fails_the_request(server: RunningServer, protocol: str) -> None:
    """Triton 2.69: a header the pattern would forward under a name Triton reserves (here one starting with
    "triton_", which the partial match of my_header.* finds) fails the request with INVALID_ARG."""
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    try:
        key = dict(HTTP_INFER_KEY if protocol == "http" else GRPC_INFER_KEY)
        with pytest.raises(InferenceServerException) as raised:
            client.infer("echo", _inputs(module), headers={**key, "triton_my_header": "x"})
        assert raised.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
        assert "Header 'triton_my_header' is reserved for Triton usage and cannot be forwarded." in str(raised.value)
        client.infer("echo", _inputs(module), headers={**key, "my_header_1": "fine"})  # the next one is served
    finally:
        client.close()


@pytest.mark.parametrize("name", ["sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                                  "binary_data_output", "triton_anything"])
def test_reserved_names_are_never_forwarded(name: str) -> None:
    forwarder = HeaderForwarder("", "--http-header-forward-pattern")
    with pytest.raises(ServerError, match=f"Header '{name}' is reserved for Triton usage"):
        forwarder.matching([("x-other", "1"), (name, "2")])
    assert forwarder.matching([("sequence_ids", "1")]) == {"sequence_ids": "1"}


@pytest.mark.parametrize(("pattern", "name", "forwarded"), [
    ("my_header.*", "MY_HEADER_1", True),  # case-insensitive by default, as Triton's "(?i)" prefix makes it
    ("(?-i)MY_HEADER.*", "my_header_1", False),
    ("(?-i)MY_HEADER.*", "MY_HEADER_1", True),
    ("header", "x-my-header-1", True),  # a partial match is enough (RE2's PartialMatch)
    ("^header", "x-header", False),
    ("a(?-i)b|c", "C", False),  # the flag lasts to the end of its group, across "|"
    ("a(?-i)b|c", "Ab", True),
    ("x(y(?-i)z|w)v", "XYzV", True),
    ("x(y(?-i)z|w)v", "XyZv", False),
    ("[(?-i)]A", "(a", True),  # inside a class, "(?-i)" is four characters
    ("", "any-header", True),  # an empty pattern forwards every header, as Triton's "(?i)" does
])
def test_forward_pattern_follows_re2(pattern: str, name: str, forwarded: bool) -> None:
    assert bool(forward_pattern_regex(pattern, "--http-header-forward-pattern").search(name)) is forwarded


# ---- mapping, parsing and start-up errors -----------------------------------------------------------

@pytest.mark.parametrize(("path", "category"), [
    ("/v2/health/live", "health"), ("/v2/health/ready", "health"), ("/v2/models/m/ready", "health"),
    ("/v2/models/m/versions/2/ready", "health"), ("/v2", "metadata"), ("/v2/models/m", "metadata"),
    ("/v2/models/m/versions/3", "metadata"), ("/v2/models/m/infer", "inference"),
    ("/v2/models/m/versions/1/infer", "inference"), ("/v2/models/m/generate_stream", "inference"),
    ("/v2/systemsharedmemory/status", "shared-memory"), ("/v2/cudasharedmemory/region/r/register", "shared-memory"),
    ("/v2/models/m/config", "model-config"), ("/v2/repository/index", "model-repository"),
    ("/v2/repository/models/m/load", "model-repository"), ("/v2/repository/r/models/m/unload", "model-repository"),
    ("/v2/models/stats", "statistics"), ("/v2/models/m/versions/1/stats", "statistics"),
    ("/v2/trace/setting", "trace"), ("/v2/models/m/trace/setting", "trace"), ("/v2/logging", "logging"),
    ("/v2/models/stats/ready", "health"), ("/v2/models/m/versions/1/trace/setting", None), ("/metrics", None),
    ("/v1/models/m/load", "model-repository"), ("/v1/models/m/unload", "model-repository"), ("/v1/models/m", None),
    ("/v2/health", None), ("/v2/models/m/versions/x", None),
])
def test_http_paths_map_to_tritons_categories(path: str, category: str | None) -> None:
    assert http_category(path) == category


def test_every_grpc_rpc_has_a_category() -> None:
    services = [grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
                health_pb2.DESCRIPTOR.services_by_name["Health"]]
    methods = {f"/{service.full_name}/{method.name}" for service in services for method in service.methods}
    assert methods == set(GRPC_METHOD_CATEGORIES)
    assert GRPC_METHOD_CATEGORIES["/inference.GRPCInferenceService/LogSettings"] == "logging"
    assert GRPC_METHOD_CATEGORIES["/grpc.health.v1.Health/Check"] == "health"


def test_nothing_restricted_adds_nothing_to_either_front_end() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not called")
    assert RestrictionCheck({}).guard(app, kserve_category) is app
    assert grpc_interceptors({}) == []


def test_settings_reach_front_end_processes_intact() -> None:
    options = options_from_args(build_parser().parse_args([
        "--http-restricted-api=health,metadata:k=v", "--grpc-restricted-protocol=inference:k=a=b",
        "--http-header-forward-pattern=(?-i)X-.*", "--grpc-header-forward-pattern="]))
    frontend = options.frontend_options()
    assert frontend.http_restricted_api == {"health": ("k", "v"), "metadata": ("k", "v")}
    assert frontend.grpc_restricted_protocol == {"inference": ("triton-grpc-protocol-k", "a=b")}
    assert (frontend.http_header_forward_pattern, frontend.grpc_header_forward_pattern) == ("(?-i)X-.*", "")
    assert FrontendOptions.from_dict(json.loads(json.dumps(frontend.to_dict()))) == frontend


@pytest.mark.parametrize(("argv", "message"), [
    (["--http-restricted-api=model-repository,health:k1=v1", "--http-restricted-api=metadata,health:k2=v2"],
     "--http-restricted-api: restricted api 'health' can not be specified in multiple config groups"),
    (["--http-restricted-api=model-reposit,health:k1=v1"], "--http-restricted-api: unknown restricted api "
                                                           "'model-reposit'"),
    (["--grpc-restricted-protocol=health,health:k=v"],
     "--grpc-restricted-protocol: restricted protocol 'health' can not be specified in multiple config groups"),
    (["--grpc-restricted-protocol=Health:k=v"], "--grpc-restricted-protocol: unknown restricted protocol 'Health'"),
    (["--grpc-restricted-protocol=health"],
     "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got health"),
    (["--http-restricted-api=health:k"], "--http-restricted-api option format is "
                                         "'<config name>:<setting>=<value>'. Got health:k"),
    (["--http-restricted-api=health:=v"], "Got health:=v"),
    (["--http-restricted-api=health:k="], "Got health:k="),
    (["--http-restricted-api=:k=v"], "Got :k=v"),
    (["--http-header-forward-pattern=my_(header"], "--http-header-forward-pattern: invalid regular expression "
                                                   "'my_(header'"),
    (["--grpc-header-forward-pattern=(?U)x"], "--grpc-header-forward-pattern: invalid regular expression"),
])
def test_bad_flag_values_are_start_up_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ServerError) as error:
        options_from_args(build_parser().parse_args(argv))
    assert message in error.value.message


def test_a_bad_pattern_given_in_server_options_fails_the_start(tmp_path: Path) -> None:
    server = Server(ServerOptions(model_repositories=[str(tmp_path)], http_port=free_port(), grpc_port=free_port(),
                                  http_address="127.0.0.1", grpc_address="127.0.0.1", allow_metrics=False,
                                  grpc_header_forward_pattern="("))
    with pytest.raises(ServerError, match="--grpc-header-forward-pattern: invalid regular expression '\\('"):
        asyncio.run(server.start())


# ---- every route of every HTTP listener goes through the one check ------------------------------------

ADMIN = {"admin-key": "secret"}
IDENTITY = ('backend: "toy_identity"\nmax_batch_size: 0\n'
            'input { name: "INPUT0" data_type: TYPE_FP32 dims: [1] }\n'
            'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }')
VERTEX_PREDICT, VERTEX_HEALTH = "/v1/endpoints/e/deployedModels/d:predict", "/v1/endpoints/e/deployedModels/d"
REDIRECT = "X-Vertex-Ai-Triton-Redirect"
# Where a redirect may not go, Triton's Vertex AI listener answers 400 (generate, logging, trace) ...
NOT_REDIRECTED = re.compile(r"/v2/(?:models/[^/]+(?:/versions/1)?/(?:generate|generate_stream|trace/setting)"
                            r"|logging|trace/setting)")
# ... and where it changes state, 403 whatever the headers (Triton 2.68).
STATE_CHANGING = re.compile(r"/v2/(?:repository(?:/r)?/models/[^/]+/(?:load|unload)"
                            r"|(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(?:register|unregister))")


def _kserve_routes() -> list[tuple[str, str]]:
    """(method, a concrete path) for every route the KServe v2 app serves: each starlette route, and the
    inference paths it serves without starlette."""
    frontend = HttpFrontend(None)  # type: ignore[arg-type]  # routing only: no request reaches the data plane
    routes = []
    for route in frontend._routes().routes:
        assert isinstance(route, Route)
        path = route.path.replace("{model}", "ident").replace("{version:int}", "1").replace(
            "{repository}", "r").replace("{region}", "reg")
        assert "{" not in path, f"a path parameter the test does not fill in: {route.path}"
        routes += [(method, path) for method in sorted(route.methods or ()) if method != "HEAD"]
    for raw in ("infer", "generate", "generate_stream"):
        for prefix in ("/v2/models/ident", "/v2/models/ident/versions/1"):
            path = f"{prefix}/{raw}"
            assert INFER_PATH.fullmatch(path) or GENERATE_PATH.fullmatch(path)
            routes.append(("POST", path))
    return routes


def test_every_kserve_route_has_a_restricted_category() -> None:
    """A route added to the HTTP app without a category in restricted.py fails here."""
    routes = _kserve_routes()
    assert len(routes) > 30
    unchecked = [(method, path) for method, path in routes if http_category(path) is None]
    assert unchecked == []


@pytest.fixture(scope="module", params=[0, 2], ids=["in-process", "frontend-processes"])
def guarded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Every category restricted on HTTP (the SageMaker and Vertex AI listeners too) and gRPC; ``ident`` loaded,
    ``other`` in the repository but not loaded (explicit model control); front-ends in the test process or in
    two front-end processes."""
    repo = tmp_path_factory.mktemp("guarded")
    for name in ("ident", "other"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(IDENTITY)
    every = [",".join(CATEGORIES) + ":admin-key=secret"]
    running = RunningServer(ServerOptions(
        model_repositories=[str(repo)], http_port=free_port(), grpc_port=free_port(), http_address="127.0.0.1",
        grpc_address="127.0.0.1", allow_metrics=False, model_control_mode="explicit", load_models=["ident"],
        extra_plugins=[("toy", ToyBackendsPlugin())], frontend_processes=request.param,
        http_restricted_api=parse_restrictions("--http-restricted-api", every, kind="api"),
        grpc_restricted_protocol=parse_restrictions("--grpc-restricted-protocol", every, kind="protocol",
                                                    header_prefix=GRPC_HEADER_PREFIX),
        platforms=PlatformOptions(sagemaker_port=free_port(), sagemaker_default_model="ident",
                                  vertex_ai_port=free_port(), vertex_ai_predict_route=VERTEX_PREDICT,
                                  vertex_ai_health_route=VERTEX_HEALTH, vertex_ai_default_model="ident")))
    yield running
    running.stop()


def _model_states(server: RunningServer) -> dict[str, str]:
    answer = httpx.post(f"http://{server.http_url}/v2/repository/index", json={}, headers=ADMIN, timeout=30)
    assert answer.status_code == 200, answer.text
    return {entry["name"]: entry.get("state", "") for entry in answer.json()}


REFUSED = {"error": "This API is restricted, expecting header 'admin-key'"}


def test_no_http_listener_serves_a_route_without_the_header(guarded: RunningServer) -> None:
    """Every KServe v2 route, on the HTTP port and redirected through Vertex AI, and every SageMaker and Vertex AI
    route: refused without the header; no model changed state."""
    before = _model_states(guarded)
    assert before == {"ident": "READY", "other": ""}
    platforms = guarded.options.platforms
    body = {"parameters": {"unload_dependents": False}}
    with httpx.Client(base_url=f"http://{guarded.http_url}", timeout=30) as http, \
            httpx.Client(base_url=f"http://127.0.0.1:{platforms.vertex_ai_port}", timeout=30) as vertex, \
            httpx.Client(base_url=f"http://127.0.0.1:{platforms.sagemaker_port}", timeout=30) as sagemaker:
        for method, path in _kserve_routes():
            answer = http.request(method, path, json=body if method == "POST" else None)
            assert (answer.status_code, answer.json()) == (403, REFUSED), (method, path)
            redirected = vertex.post(VERTEX_PREDICT, json=body, headers={REDIRECT: path[1:]})
            expected = 400 if NOT_REDIRECTED.fullmatch(path) else 403
            assert redirected.status_code == expected, (path, redirected.text)
            if expected == 403 and not STATE_CHANGING.fullmatch(path):
                assert redirected.json() == REFUSED, path
        assert vertex.post(VERTEX_PREDICT, json=body).status_code == 403  # the default model's infer
        assert vertex.get(VERTEX_HEALTH).status_code == 403
        for method, path in [("GET", "/ping"), ("POST", "/invocations"), ("GET", "/models"), ("GET", "/models/ident"),
                             ("POST", "/models"), ("DELETE", "/models/ident")]:
            answer = sagemaker.request(method, path, json=body)
            assert (answer.status_code, answer.json()) == (403, REFUSED), (method, path)
        assert sagemaker.post("/models/ident/invoke", json=body).status_code == 404  # no model registered, first
    assert _model_states(guarded) == before


def test_platform_routes_serve_with_the_header_and_redirects_never_change_state(guarded: RunningServer) -> None:
    platforms = guarded.options.platforms
    with httpx.Client(base_url=f"http://127.0.0.1:{platforms.vertex_ai_port}", timeout=30) as vertex, \
            httpx.Client(base_url=f"http://127.0.0.1:{platforms.sagemaker_port}", timeout=30) as sagemaker:
        assert vertex.get(VERTEX_HEALTH, headers=ADMIN).status_code == 200
        index = vertex.post(VERTEX_PREDICT, json={}, headers={**ADMIN, REDIRECT: "v2/repository/index"})
        assert [entry["name"] for entry in index.json()] == ["ident", "other"]
        answer = vertex.post(VERTEX_PREDICT, headers={**ADMIN, REDIRECT: "v2/models/ident/config"})
        assert answer.json()["name"] == "ident"
        for endpoint in ("v2/repository/models/ident/unload", "v2/repository/models/other/load",
                         "v2/systemsharedmemory/region/r/unregister", "v2/cudasharedmemory/register"):
            answer = vertex.post(VERTEX_PREDICT, json={}, headers={**ADMIN, REDIRECT: endpoint})
            assert (answer.status_code, answer.content) == (403, b""), endpoint
        # Vertex AI sends POST only: another method with the redirect header is 405, before the header check
        for method in ("GET", "PUT", "DELETE"):
            assert vertex.request(method, VERTEX_PREDICT, headers={REDIRECT: "v2/repository/index"}).status_code == 405
        assert sagemaker.get("/ping", headers=ADMIN).status_code == 200
        answer = sagemaker.post("/invocations", headers=ADMIN, json={"inputs": [
            {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [2.5]}]})
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [2.5]
        assert sagemaker.get("/models", headers=ADMIN).json() == {"models": []}
    assert _model_states(guarded) == {"ident": "READY", "other": ""}


def test_openai_model_control_on_the_http_port_needs_the_header(guarded: RunningServer) -> None:
    """The OpenAI plugin's POST /v1/models/{m}/load and /unload on the HTTP port are model-repository routes."""
    pytest.importorskip("triton_serve_openai")
    with httpx.Client(base_url=f"http://{guarded.http_url}", timeout=60) as http:
        for path in ("/v1/models/other/load", "/v1/models/ident/unload"):
            answer = http.post(path)
            assert (answer.status_code, answer.json()) == (403, REFUSED), path
        assert _model_states(guarded) == {"ident": "READY", "other": ""}
        assert http.post("/v1/models/other/load", headers=ADMIN).status_code == 200
        assert _model_states(guarded)["other"] == "READY"
        assert http.post("/v1/models/other/unload", headers=ADMIN).status_code == 200
    assert _model_states(guarded)["other"] == "UNAVAILABLE"


def test_grpc_model_control_needs_the_metadata(guarded: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(guarded.grpc_url)
    admin = {GRPC_HEADER_PREFIX + "admin-key": "secret"}
    try:
        for call in (lambda: client.load_model("other"), lambda: client.unload_model("ident"),
                     lambda: client.load_model("other", config='{"backend": "toy_identity"}')):
            with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-admin-key'"):
                call()
        assert client.is_model_ready("ident", headers=admin) and not client.is_model_ready("other", headers=admin)
    finally:
        client.close()
