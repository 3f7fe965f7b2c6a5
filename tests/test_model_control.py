"""Live model management: load overrides, zero-downtime reloads, unload_dependents, named repositories
and poll mode, through tritonclient's HTTP and gRPC clients."""
from __future__ import annotations

import base64
import http.client
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from triton_serve._engine.cli import build_parser, options_from_args

from .conftest import FRONTEND_MODES, write_model

IDENTITY = """
backend: "toy_identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
"""
FAIL_LOAD = 'parameters { key: "fail_load" value { string_value: "1" } }'
# A toy model file: the toy backends' auto-complete takes inputs and outputs from it.
TOY_FILE = b"""
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""
IDENTITY_JSON = json.dumps({
    "backend": "toy_identity",
    "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [2]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [2]}]})

Client = Any  # a tritonclient HTTP or gRPC client
CLIENTS = {"http": (httpclient, "http_url"), "grpc": (grpcclient, "grpc_url")}


def _client(server, protocol: str) -> Client:  # type: ignore[no-untyped-def]
    module, url = CLIENTS[protocol]
    return module.InferenceServerClient(getattr(server, url))


def _infer(client: Client, name: str, version: str = "") -> tuple[np.ndarray, str]:
    """OUTPUT0 and the answering version, for an identity model with one INT32 [2] input."""
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("INPUT0", [2], "INT32")
    tensor.set_data_from_numpy(np.array([4, 5], dtype=np.int32))
    result = client.infer(name, [tensor], model_version=version)
    response = result.get_response()
    answered = response["model_version"] if isinstance(response, dict) else response.model_version
    return result.as_numpy("OUTPUT0"), answered


def _ready_versions(client: Client, name: str, versions: range = range(1, 4)) -> list[int]:
    return [v for v in versions if client.is_model_ready(name, str(v))]


def _index(client: httpclient.InferenceServerClient) -> dict[tuple[str, str], dict[str, str]]:
    return {(e["name"], e.get("version", "")): e for e in client.get_model_repository_index()}


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)


def _post(server, path: str, body: Any) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.post(f"http://{server.http_url}{path}", json=body, timeout=30)


@pytest.fixture
def explicit_server(add_model, toy_server):  # type: ignore[no-untyped-def]
    """A server in explicit mode with 'ident' (versions 1-3, serving 3) loaded."""
    add_model("ident", IDENTITY, versions=(1, 2, 3))
    return toy_server(model_control_mode="explicit", load_models=["ident"])


# ---- config and file overrides -------------------------------------------------------------------

@pytest.mark.parametrize(("protocol", "frontend_processes"), [("http", 0), ("grpc", 0), ("grpc", 2)])
def test_config_override_reloads_and_a_plain_load_keeps_it(protocol, explicit_server) -> None:  # type: ignore[no-untyped-def]
    client = _client(explicit_server, protocol)
    assert _ready_versions(client, "ident") == [3]
    override = json.loads(IDENTITY_JSON) | {"version_policy": {"specific": {"versions": [2]}}}
    client.load_model("ident", config=json.dumps(override))
    assert _ready_versions(client, "ident") == [2]
    assert _infer(client, "ident")[1] == "2"
    client.load_model("ident")  # nothing changed on disk: the override stays, as in Triton
    assert _ready_versions(client, "ident") == [2]


@pytest.mark.parametrize(("protocol", "frontend_processes"), [("http", 0), ("grpc", 0), ("http", 2)])
def test_file_override_loads_from_a_private_directory(protocol, explicit_server) -> None:  # type: ignore[no-untyped-def]
    client = _client(explicit_server, protocol)
    repository = explicit_server.server.repository
    config = json.dumps({"backend": "toy_identity"})

    client.load_model("fresh", config=config, files={"file:1/toy_identity.toy": TOY_FILE})  # in no repository
    metadata = client.get_model_metadata("fresh", as_json=True) if protocol == "grpc" \
        else client.get_model_metadata("fresh")
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in metadata["inputs"]] == \
        [("INPUT0", "FP32", [3])]  # auto-complete read the uploaded file
    private_dir = repository.models["fresh"].private_dir
    assert private_dir is not None and (private_dir / "1" / "toy_identity.toy").read_bytes() == TOY_FILE

    # the same name as a repository model: the override directory replaces its versions
    client.load_model("ident", config=IDENTITY_JSON, files={"file:7/notes.txt": b"seven"})
    assert _ready_versions(client, "ident", range(1, 8)) == [7]
    overridden = repository.models["ident"].private_dir
    assert overridden is not None and (overridden / "7" / "notes.txt").read_bytes() == b"seven"
    client.load_model("ident")  # a plain load goes back to the repository and drops the private directory
    assert _ready_versions(client, "ident", range(1, 8)) == [3]
    assert not overridden.exists()

    client.unload_model("fresh")
    assert not client.is_model_ready("fresh") and not private_dir.exists()


FAILING_JSON = json.dumps({"backend": "toy_identity", "parameters": {"fail_load": {"string_value": "1"}}})


@pytest.mark.parametrize(("protocol", "namespacing"), [("http", False), ("grpc", False), ("http", True)])
def test_a_model_only_in_overrides_unloads_after_a_successful_or_failed_load(  # type: ignore[no-untyped-def]
        protocol, namespacing, add_model, toy_server, request) -> None:
    """A model no repository holds, loaded with override files, unloads after its load succeeded or failed; a
    failed version keeps the server not ready until that unload, as in Triton (strict readiness counts a
    version that failed to load, but not one unloaded)."""
    add_model("ident", IDENTITY)
    server = toy_server(model_control_mode="explicit", load_models=["ident"], model_namespacing=namespacing)
    client = _client(server, protocol)
    request.addfinalizer(client.close)
    files = {"file:1/toy_identity.toy": TOY_FILE}
    client.load_model("fresh", config=json.dumps({"backend": "toy_identity"}), files=files)
    assert client.is_model_ready("fresh")
    client.unload_model("fresh")
    assert not client.is_model_ready("fresh") and client.is_server_ready()

    with pytest.raises(InferenceServerException, match="was told to fail loading"):
        client.load_model("fresh", config=FAILING_JSON, files=files)
    assert not client.is_server_ready()
    client.unload_model("fresh")
    assert client.is_server_ready() and client.is_model_ready("ident")
    client.load_model("fresh", config=json.dumps({"backend": "toy_identity"}), files=files)  # loads again at once
    assert client.is_model_ready("fresh")
    client.unload_model("fresh")
    assert not client.is_model_ready("fresh") and client.is_server_ready()


@pytest.mark.parametrize("namespacing", [False, True])
def test_an_override_that_fails_its_poll_leaves_readiness_as_it_was(namespacing, add_model, toy_server,  # type: ignore[no-untyped-def]
                                                                     request) -> None:
    """A load whose override Triton cannot even poll (here an input without a data type) never reaches its model
    life cycle: the server stays ready, and nothing is left to unload."""
    add_model("ident", IDENTITY)
    server = toy_server(model_control_mode="explicit", load_models=["ident"], model_namespacing=namespacing)
    client = _client(server, "http")
    request.addfinalizer(client.close)
    broken = json.dumps({"backend": "toy_identity", "input": [{"name": "INPUT0", "dims": [2]}]})
    with pytest.raises(InferenceServerException, match="failed to load 'fresh', failed to poll from model repository"):
        client.load_model("fresh", config=broken, files={"file:1/toy_identity.toy": TOY_FILE})
    assert client.is_server_ready() and not client.is_model_ready("fresh")
    client.load_model("fresh", config=json.dumps({"backend": "toy_identity"}), files={"file:1/toy_identity.toy": TOY_FILE})
    client.unload_model("fresh")
    assert client.is_server_ready() and not client.is_model_ready("fresh")


def _http_load_error(server, name: str, parameters: dict[str, Any]) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    response = _post(server, f"/v2/repository/models/{name}/load", {"parameters": parameters})
    return response.status_code, response.json()["error"]


B64 = base64.b64encode(b"data").decode()


@pytest.mark.parametrize(("parameters", "message"), [
    pytest.param({"config": "{not json"}, "failed to load 'ident', failed to poll from model repository: Invalid "
                 "config override: Failed to load JSON", id="config-not-json"),
    pytest.param({"config": '{"max_batch_size": "many"}'},
                 "Invalid config override: Failed to parse max_batch_size field", id="config-bad-field"),
    pytest.param({"config": '{"no_such_field": 1}'}, 'has no field named "no_such_field"', id="config-unknown-field"),
    pytest.param({"config": 3}, "Unable to parse load parameter 'config': expected a JSON string",
                 id="config-not-a-string"),
    pytest.param({"file:1/model.toy": B64}, "failed to load 'ident', failed to poll from model repository: Load "
                 "parameter 'config' must be specified for model file override", id="files-without-config"),
    pytest.param({"config": IDENTITY_JSON, "file:../escaped.txt": B64}, "Invalid file parameter "
                 "'file:../escaped.txt': the path must be relative and stay within the model directory",
                 id="file-dot-dot"),
    pytest.param({"config": IDENTITY_JSON, "file:1/../../escaped.txt": B64},
                 "Invalid file parameter 'file:1/../../escaped.txt'", id="file-inner-dot-dot"),
    pytest.param({"config": IDENTITY_JSON, "file:/tmp/escaped.txt": B64},
                 "Invalid file parameter 'file:/tmp/escaped.txt'", id="file-absolute"),
    pytest.param({"config": IDENTITY_JSON, "file:v1/model.toy": B64},
                 "Invalid file parameter 'file:v1/model.toy': 'v1' is not a model version folder",
                 id="file-not-in-a-version"),
    pytest.param({"config": IDENTITY_JSON, "file:1/model.toy": "not base64!"},
                 "Unable to parse load parameter 'file:1/model.toy': its value is not valid base64",
                 id="file-bad-base64"),
    pytest.param({"config": IDENTITY_JSON, "file:1": B64, "file:1/model.toy": B64},
                 "Invalid file parameter 'file:1/model.toy': its folder 'file:1' is a file", id="file-under-a-file"),
    pytest.param({"colour": "blue"}, "unrecognized load parameter 'colour'.", id="unknown-parameter"),
])
def test_bad_http_overrides_are_400_naming_the_parameter_and_change_nothing(  # type: ignore[no-untyped-def]
        parameters, message, explicit_server, tmp_path) -> None:
    client = httpclient.InferenceServerClient(explicit_server.http_url)
    before = _index(client)
    status, error = _http_load_error(explicit_server, "ident", parameters)
    assert status == 400 and message in error
    assert _index(client) == before and _infer(client, "ident")[1] == "3"
    assert not list(tmp_path.parent.glob("**/escaped.txt")) and not Path("/tmp/escaped.txt").exists()


@pytest.mark.parametrize(("parameter", "value", "message"), [
    pytest.param("config", {"bytes_param": IDENTITY_JSON.encode()},
                 "invalid value type for load parameter 'config', expected string_param.", id="config-as-bytes"),
    pytest.param("file:1/model.toy", {"string_param": "text"},
                 "invalid value type for load parameter 'file:1/model.toy', expected bytes_param.",
                 id="file-as-string"),
    pytest.param("colour", {"string_param": "blue"}, "unrecognized load parameter 'colour'.", id="unknown-parameter"),
])
def test_bad_grpc_load_parameters(parameter, value, message, explicit_server) -> None:  # type: ignore[no-untyped-def]
    request = service_pb2.RepositoryModelLoadRequest(model_name="ident")
    request.parameters[parameter].MergeFrom(service_pb2.ModelRepositoryParameter(**value))
    with grpc.insecure_channel(explicit_server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and raised.value.details() == message


# ---- zero-downtime reloads -----------------------------------------------------------------------

def test_failed_reload_keeps_the_serving_version_and_says_why(explicit_server, repo) -> None:  # type: ignore[no-untyped-def]
    client = httpclient.InferenceServerClient(explicit_server.http_url)
    (repo / "ident" / "config.pbtxt").write_text(IDENTITY + FAIL_LOAD)
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("ident")
    assert raised.value.status() == "400"
    assert raised.value.message() == ("load failed for model 'ident': version 3 is at UNAVAILABLE state: "
                                      "toy model 'ident' was told to fail loading;")
    assert _infer(client, "ident")[1] == "3" and client.is_server_ready()
    entry = _index(client)[("ident", "3")]
    assert entry["state"] == "READY"
    assert entry["reason"] == ("the last reload failed, so this version keeps serving: load failed for model 'ident': "
                               "version 3 is at UNAVAILABLE state: toy model 'ident' was told to fail loading;")

    (repo / "ident" / "config.pbtxt").write_text('backend: "no_such_backend"')  # fails before loading
    with pytest.raises(InferenceServerException, match="no_such_backend"):
        client.load_model("ident")
    assert _infer(client, "ident")[1] == "3"

    (repo / "ident" / "config.pbtxt").write_text(IDENTITY + "version_policy { latest { num_versions: 2 } }")
    client.load_model("ident")
    assert _ready_versions(client, "ident") == [2, 3]
    assert all(not e.get("reason") for e in _index(client).values())


def test_reload_under_load_fails_no_request(add_model, toy_server, repo) -> None:  # type: ignore[no-untyped-def]
    slow = IDENTITY + 'parameters { key: "delay_s" value { string_value: "0.02" } }'
    add_model("ident", slow)
    server = toy_server(model_control_mode="explicit", load_models=["ident"])
    failures: list[str] = []
    answered: list[str] = []
    stop = threading.Event()

    def drive() -> None:
        client = httpclient.InferenceServerClient(server.http_url)
        while not stop.is_set():
            try:
                answered.append(_infer(client, "ident")[1])
            except InferenceServerException as error:
                failures.append(error.message())

    drivers = [threading.Thread(target=drive) for _ in range(4)]
    for driver in drivers:
        driver.start()
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        _wait_for(lambda: len(answered) > 5, "requests flow")
        for version in (2, 3, 4):
            write_model(repo, "ident", slow, versions=(version,))
            client.load_model("ident")
            assert _infer(client, "ident")[1] == str(version)
        _wait_for(lambda: answered[-1] == "4", "requests reach the last version")
    finally:
        stop.set()
        for driver in drivers:
            driver.join()
    assert failures == []
    assert {"1", "4"} <= set(answered)


# ---- unload_dependents ---------------------------------------------------------------------------

@pytest.mark.parametrize(("protocol", "frontend_processes"), [("http", 0), ("grpc", 0), ("grpc", 2)])
def test_unload_dependents_unloads_the_models_using_it(protocol, add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    for name in ("step", "pipeline", "outer", "other"):
        add_model(name, IDENTITY)
    server = toy_server(model_control_mode="explicit", load_models=["*"])
    repository = server.server.repository

    async def declare() -> None:
        repository.declare_dependencies("pipeline", ["step"])
        repository.declare_dependencies("outer", ["pipeline", "other"])
    server.call(declare)
    client = _client(server, protocol)
    client.unload_model("step")  # the models using it cannot run without it: they unload too, as in Triton
    assert [client.is_model_ready(n) for n in ("step", "pipeline", "outer", "other")] == [False, False, False, True]
    for name in ("step", "pipeline", "outer"):
        client.load_model(name)
    client.unload_model("step", unload_dependents=True)
    assert [client.is_model_ready(n) for n in ("step", "pipeline", "outer", "other")] == [False, False, False, True]
    for name in ("step", "pipeline", "outer"):
        client.load_model(name)
    # the flag also unloads what the model uses, but only models no load asked for (all were asked for here)
    client.unload_model("outer", unload_dependents=True)
    assert [client.is_model_ready(n) for n in ("step", "pipeline", "outer", "other")] == [True, True, False, True]


def test_unload_dependents_must_be_a_boolean(explicit_server) -> None:  # type: ignore[no-untyped-def]
    response = _post(explicit_server, "/v2/repository/models/ident/unload",
                     {"parameters": {"unload_dependents": "yes"}})
    assert response.status_code == 400
    assert response.json()["error"] == \
        "Unable to parse 'unload_dependents': attempt to access JSON non-boolean as boolean"
    request = service_pb2.RepositoryModelUnloadRequest(model_name="ident")
    request.parameters["unload_dependents"].string_param = "yes"
    with grpc.insecure_channel(explicit_server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelUnload(request)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == "invalid value type for 'unload_dependents' parameter, expected bool_param."
    assert httpclient.InferenceServerClient(explicit_server.http_url).is_model_ready("ident")


# ---- repository names ----------------------------------------------------------------------------

@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES)
def test_repository_name_routes_select_the_repository(tmp_path, tserve, toy_plugin, frontend_processes) -> None:  # type: ignore[no-untyped-def]
    write_model(tmp_path / "alpha", "first", IDENTITY)
    write_model(tmp_path / "beta", "second", IDENTITY)
    server = tserve(tmp_path / "alpha", tmp_path / "beta", extra_plugins=[("toy", toy_plugin)],
                    model_control_mode="explicit", frontend_processes=frontend_processes)
    index = _post(server, "/v2/repository/alpha/index", {})
    assert index.status_code == 200 and index.json() == [{"name": "first"}]

    wrong = _post(server, "/v2/repository/alpha/models/second/load", {})
    assert wrong.status_code == 400
    assert wrong.json()["error"] == "failed to load 'second', failed to poll from model repository"
    assert _post(server, "/v2/repository/beta/models/second/load", {}).status_code == 200
    unknown = _post(server, "/v2/repository/gamma/models/second/load", {})
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "model repository 'gamma' not found; the repositories are: 'alpha', 'beta'"
    not_there = _post(server, "/v2/repository/alpha/models/second/unload", {})
    assert not_there.status_code == 404
    assert not_there.json()["error"] == "model 'second' was not loaded from model repository 'alpha'"

    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(repository_name="alpha", model_name="first"))
        ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(repository_name="beta", ready=True))
        assert [(m.name, m.state) for m in ready.models] == [("second", "READY")]
        stub.RepositoryModelUnload(
            service_pb2.RepositoryModelUnloadRequest(repository_name="beta", model_name="second"))
        with pytest.raises(grpc.RpcError) as raised:
            stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(repository_name="gamma"))
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("first") and not client.is_model_ready("second")


# ---- model names -----------------------------------------------------------------------------------

def _bad_name(name: str) -> str:
    return (f"invalid model name '{name}': a model name must be one folder name of the model repository (not "
            "empty, '.' or '..', and without '/', '\\' or NUL characters)")


def _post_raw(server, path: str) -> tuple[int, dict[str, Any]]:  # type: ignore[no-untyped-def]
    """POST ``path`` exactly as written (http.client neither normalizes '..' nor re-encodes)."""
    host, port = server.http_url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", path, body=b"{}", headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES)
def test_a_model_name_that_leaves_the_repository_is_refused(repo, add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    write_model(repo.parent, "outside", IDENTITY)  # beside the repository, where '../outside' points
    add_model("ident", IDENTITY)
    server = toy_server(model_control_mode="explicit")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for name in ("../outside", "./../outside", "ident/../../outside", "..", ".", "", "a\\b", "ident\0"):
        for call in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as raised:
                call(name)
            assert (raised.value.status(), raised.value.message()) == ("StatusCode.INVALID_ARGUMENT", _bad_name(name))
    with grpc.insecure_channel(server.grpc_url) as channel:  # the route that names the repository too
        with pytest.raises(grpc.RpcError) as error:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                service_pb2.RepositoryModelLoadRequest(repository_name="models", model_name="../outside"))
        assert (error.value.code(), error.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                               _bad_name("../outside"))
    # Over HTTP a name is one path segment: '..', '.', '\' and NUL reach the routes, '/' cannot.
    for segment, name in (("..", ".."), (".", "."), ("a%5Cb", "a\\b"), ("ident%00", "ident\0")):
        for path in (f"/v2/repository/models/{segment}/load", f"/v2/repository/models/{segment}/unload",
                     f"/v2/repository/models/models/{segment}/load"):  # the last names the repository 'models'
            assert _post_raw(server, path) == (400, {"error": _bad_name(name)}), path
    assert _post_raw(server, "/v2/repository/models/..%2Foutside/load")[0] == 404  # no route: nothing loads
    http_client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException):
        http_client.load_model("../outside")
    assert not any(http_client.is_model_ready(name) for name in ("outside", "../outside", "ident/../../outside"))
    assert [entry["name"] for entry in http_client.get_model_repository_index()] == ["ident"]
    assert http_client.is_server_ready()
    client.load_model("ident")  # a plain name still loads
    assert http_client.is_model_ready("ident")


# ---- poll mode -------------------------------------------------------------------------------------

def test_poll_mode_follows_the_repository(add_model, toy_server, repo) -> None:  # type: ignore[no-untyped-def]
    add_model("kept", IDENTITY)
    add_model("leaving", IDENTITY)
    server = toy_server(model_control_mode="poll", repository_poll_secs=0.1)
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("kept") and client.is_model_ready("leaving")
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("kept")
    assert raised.value.status() == "503"
    assert raised.value.message() == "explicit model load / unload is not allowed if polling is enabled"

    add_model("arriving", IDENTITY)
    _wait_for(lambda: client.is_model_ready("arriving"), "a new model loads")
    write_model(repo, "kept", IDENTITY, versions=(2,))
    _wait_for(lambda: _ready_versions(client, "kept") == [2], "a new version replaces the old one")
    shutil.rmtree(repo / "leaving")
    _wait_for(lambda: not client.is_model_ready("leaving"), "a removed model unloads")
    assert ("leaving", "") not in _index(client) and ("leaving", "1") not in _index(client)

    (repo / "kept" / "config.pbtxt").write_text(IDENTITY + FAIL_LOAD)
    _wait_for(lambda: _index(client)[("kept", "2")]["reason"], "the failed reload shows in the index")
    assert _index(client)[("kept", "2")]["state"] == "READY" and _infer(client, "kept")[1] == "2"
    (repo / "kept" / "config.pbtxt").write_text(IDENTITY + "version_policy { all { } }")
    _wait_for(lambda: _ready_versions(client, "kept") == [1, 2], "the fixed model reloads")
    assert not _index(client)[("kept", "2")]["reason"]


def test_poll_flags() -> None:
    options = options_from_args(build_parser().parse_args(["--model-control-mode=poll", "--repository-poll-secs=3"]))
    assert (options.model_control_mode, options.repository_poll_secs) == ("poll", 3)
    assert options_from_args(build_parser().parse_args([])).repository_poll_secs == 15
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--repository-poll-secs=-1"])
