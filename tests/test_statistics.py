"""The statistics extension over HTTP and gRPC, with the built-in pass-through scheduler."""
from __future__ import annotations

import concurrent.futures

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.testing import probe_config

from .conftest import ADD_SUB, write_model


def _add_sub_inputs(module, batch: int = 1):  # type: ignore[no-untyped-def]
    data = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    inputs = [module.InferInput("INPUT0", [batch, 16], "INT32"), module.InferInput("INPUT1", [batch, 16], "INT32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return inputs


def test_counts_successes_failures_and_batch_sizes_over_http(add_model, toy_server) -> None:
    add_model("add_sub", ADD_SUB + "version_policy: { all { } }", versions=(1, 2))
    server = toy_server()
    client = httpclient.InferenceServerClient(server.http_url)
    for batch in (1, 1, 3):
        client.infer("add_sub", _add_sub_inputs(httpclient, batch))
    bad = httpclient.InferInput("INPUT0", [1, 15], "INT32")
    bad.set_data_from_numpy(np.zeros((1, 15), np.int32))
    with pytest.raises(InferenceServerException):
        client.infer("add_sub", [bad, _add_sub_inputs(httpclient)[1]])

    stats = client.get_inference_statistics("add_sub", "2")["model_stats"]
    assert len(stats) == 1
    entry = stats[0]
    assert (entry["name"], entry["version"]) == ("add_sub", "2")
    assert entry["inference_count"] == 5 and entry["execution_count"] == 3
    inference = entry["inference_stats"]
    assert inference["success"]["count"] == 3 and inference["success"]["ns"] > 0
    assert inference["fail"]["count"] == 1
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[phase]["count"] == 3, phase
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in entry["batch_stats"]} == {1: 2, 3: 1}
    assert entry["last_inference"] > 1_600_000_000_000  # milliseconds since the epoch

    version_one = client.get_inference_statistics("add_sub", "1")["model_stats"][0]
    assert version_one["inference_count"] == 0 and version_one["inference_stats"]["success"]["count"] == 0
    assert len(client.get_inference_statistics("add_sub")["model_stats"]) == 2
    assert {s["version"] for s in client.get_inference_statistics()["model_stats"]} == {"1", "2"}


def test_grpc_statistics_match_the_http_ones(add_model, toy_server) -> None:
    add_model("add_sub", ADD_SUB)
    server = toy_server()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.infer("add_sub", _add_sub_inputs(grpcclient, 2))
    stats = client.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
    assert stats["name"] == "add_sub" and stats["version"] == "1"
    assert int(stats["inference_count"]) == 2 and int(stats["execution_count"]) == 1
    assert int(stats["inference_stats"]["success"]["count"]) == 1
    assert [int(b["batch_size"]) for b in stats["batch_stats"]] == [2]
    http_stats = httpx.get(f"http://{server.http_url}/v2/models/add_sub/stats").json()["model_stats"][0]
    assert http_stats["inference_count"] == int(stats["inference_count"])
    assert "statistics" in client.get_server_metadata(as_json=True)["extensions"]


def test_statistics_errors_name_the_model(add_model, toy_server) -> None:
    add_model("add_sub", ADD_SUB)
    server = toy_server()
    response = httpx.get(f"http://{server.http_url}/v2/models/nope/stats")
    assert response.status_code == 404 and "nope" in response.json()["error"]
    response = httpx.get(f"http://{server.http_url}/v2/models/add_sub/versions/7/stats")
    assert response.status_code == 404 and "version 7" in response.json()["error"]
    with pytest.raises(InferenceServerException) as raised:
        grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics("nope")
    assert raised.value.status() == "StatusCode.NOT_FOUND"


def _peaks_of_two_concurrent_requests(server) -> list[int]:  # type: ignore[no-untyped-def]
    """Send two 0.3 s requests to the toy_probe model "slow" at once; each answer's PEAK is how many
    executions of the model had run at the same time by then."""
    def infer(_: int) -> int:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.full((1, 1), 0.3, np.float32))
        return int(client.infer("slow", [tensor]).as_numpy("PEAK")[0, 0])

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return list(pool.map(infer, range(2)))


def test_two_instances_run_two_requests_at_once(repo, toy_server) -> None:  # type: ignore[no-untyped-def]
    write_model(repo, "slow", probe_config() + "instance_group [ { count: 2 kind: KIND_CPU } ]")
    server = toy_server()
    assert max(_peaks_of_two_concurrent_requests(server)) == 2
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics("slow")["model_stats"][0]
    assert stats["execution_count"] == 2 and stats["inference_stats"]["queue"]["count"] == 2


def test_rate_limiter_lets_only_instances_holding_the_resource_run(repo, toy_server) -> None:  # type: ignore[no-untyped-def]
    write_model(repo, "slow", probe_config() + """
instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 } ] } } ]""")
    server = toy_server(rate_limit="execution_count", rate_limit_resources={("R", None): 1})
    # One unit of R: the two instances take turns, never running at once.
    assert _peaks_of_two_concurrent_requests(server) == [1, 1]
    assert httpclient.InferenceServerClient(server.http_url).get_inference_statistics("slow")[
        "model_stats"][0]["execution_count"] == 2


def test_rate_limit_resource_below_an_instance_need_fails_the_load(add_model, toy_server) -> None:
    add_model("slow", probe_config() + """
instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 3 } ] } } ]""")
    add_model("add_sub", ADD_SUB)
    server = toy_server(rate_limit="execution_count", rate_limit_resources={("R", None): 2})
    index = {m["name"]: m for m in httpclient.InferenceServerClient(server.http_url).get_model_repository_index()}
    assert index["slow"]["state"] == "UNAVAILABLE"
    assert "needs 3 of rate limiter resource 'R'" in index["slow"]["reason"]
    assert index["add_sub"]["state"] == "READY"


def test_kind_gpu_without_a_gpu_fails_clearly(add_model, toy_server, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    add_model("gpu_model", ADD_SUB + "instance_group [ { kind: KIND_GPU } ]")
    server = toy_server()
    index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    assert index[0]["state"] == "UNAVAILABLE"
    assert ("instance group gpu_model_0 of model gpu_model has kind KIND_GPU but no GPUs are available"
            in index[0]["reason"])
