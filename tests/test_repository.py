"""Version folders and policies, version states, explicit load and unload, and failing models."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from triton_serve.testing import pretend_gpus
from tritonclient.utils import InferenceServerException

from .conftest import ADD_SUB, write_model

IDENTITY = """
backend: "toy_identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
"""


def _infer_identity(client: httpclient.InferenceServerClient, name: str, version: str = "") -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", [2], "INT32")
    tensor.set_data_from_numpy(np.array([4, 5], dtype=np.int32))
    return client.infer(name, [tensor], model_version=version).as_numpy("OUTPUT0")


@pytest.mark.parametrize(("policy", "loaded"), [
    ("", ["3"]),
    ("version_policy { latest { num_versions: 2 } }", ["2", "3"]),
    ("version_policy { all { } }", ["1", "2", "3"]),
    ("version_policy { specific { versions: [1, 3] } }", ["1", "3"]),
])
def test_version_policies(policy: str, loaded: list[str], add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("ident", IDENTITY + policy, versions=[1, 2, 3, "04", "abc"])
    client = httpclient.InferenceServerClient(toy_server().http_url)
    assert client.get_model_metadata("ident")["versions"] == loaded
    index = [e for e in client.get_model_repository_index() if e["name"] == "ident"]
    assert [e["version"] for e in index] == loaded and {e["state"] for e in index} == {"READY"}
    for version in loaded:
        assert client.is_model_ready("ident", version)
        assert _infer_identity(client, "ident", version).tolist() == [4, 5]
    assert not client.is_model_ready("ident", "4")  # "04" is not a version folder
    with pytest.raises(InferenceServerException, match="'ident' version 9 is not found") as error:
        _infer_identity(client, "ident", "9")
    assert error.value.status() == "404"


def test_specific_policy_for_a_missing_folder_fails_the_model(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("ident", IDENTITY + "version_policy { specific { versions: [7] } }")
    client = httpclient.InferenceServerClient(toy_server().http_url)
    (entry,) = client.get_model_repository_index()
    assert entry["state"] == "UNAVAILABLE" and "version(s) 7, which have no version folder" in entry["reason"]


def test_failing_model_does_not_stop_the_others(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("good", IDENTITY)
    add_model("broken_config", "max_batch_size: [")
    add_model("fails_to_load", IDENTITY + 'parameters { key: "fail_load" value { string_value: "1" } }')
    add_model("no_versions", IDENTITY, versions=[])
    server = toy_server()
    client = httpclient.InferenceServerClient(server.http_url)
    assert _infer_identity(client, "good").tolist() == [4, 5]
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert "failed to parse model config for 'broken_config'" in index["broken_config"]["reason"]
    assert index["fails_to_load"]["state"] == "UNAVAILABLE"
    assert "was told to fail loading" in index["fails_to_load"]["reason"]
    assert "no numeric version folder" in index["no_versions"]["reason"]
    ready_only = httpx.post(f"http://{server.http_url}/v2/repository/index", json={"ready": True})
    assert ready_only.json() == [{"name": "good", "version": "1", "state": "READY", "reason": ""}]
    with pytest.raises(InferenceServerException, match="'fails_to_load' has no available versions"):
        _infer_identity(client, "fails_to_load")
    assert not client.is_server_ready()


def test_exit_on_error_stops_start_up(add_model, tserve, toy_plugin, repo) -> None:  # type: ignore[no-untyped-def]
    add_model("fails_to_load", IDENTITY + 'parameters { key: "fail_load" value { string_value: "1" } }')
    with pytest.raises(Exception, match="exiting because model\\(s\\) failed to load"):
        tserve(repo, extra_plugins=[("toy", toy_plugin)], exit_on_error=True)


def test_strict_readiness_off_ignores_failed_models(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("fails_to_load", IDENTITY + 'parameters { key: "fail_load" value { string_value: "1" } }')
    assert httpclient.InferenceServerClient(toy_server(strict_readiness=False).http_url).is_server_ready()


def test_several_repositories(tmp_path, tserve, toy_plugin) -> None:  # type: ignore[no-untyped-def]
    write_model(tmp_path / "a", "one", IDENTITY)
    write_model(tmp_path / "b", "two", IDENTITY)
    write_model(tmp_path / "b", "one", IDENTITY)
    server = tserve(tmp_path / "a", tmp_path / "b", extra_plugins=[("toy", toy_plugin)])
    client = httpclient.InferenceServerClient(server.http_url)
    assert _infer_identity(client, "two").tolist() == [4, 5]
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert "appears in more than one model repository" in index["one"]["reason"]


def test_explicit_mode_loads_only_what_is_asked(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("ident", IDENTITY)
    client = httpclient.InferenceServerClient(
        toy_server(model_control_mode="explicit", load_models=["add_sub"]).http_url)
    assert client.is_model_ready("add_sub") and not client.is_model_ready("ident")
    assert client.is_server_ready()  # models never asked for do not count
    assert {"name": "ident"} in client.get_model_repository_index()

    client.load_model("ident")
    assert _infer_identity(client, "ident").tolist() == [4, 5]
    client.unload_model("ident")
    assert not client.is_model_ready("ident")
    assert {"name": "ident", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in \
        client.get_model_repository_index()
    assert client.is_server_ready()  # an unloaded model does not make the server unready
    with pytest.raises(InferenceServerException, match="'ident' has no available versions"):
        _infer_identity(client, "ident")
    client.load_model("ident")  # loading again brings it back
    assert client.is_model_ready("ident")


def test_explicit_load_errors(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("broken", IDENTITY + 'parameters { key: "fail_load" value { string_value: "1" } }')
    client = httpclient.InferenceServerClient(toy_server(model_control_mode="explicit").http_url)
    with pytest.raises(InferenceServerException, match="failed to load 'nope', failed to poll from model repository"):
        client.load_model("nope")
    with pytest.raises(InferenceServerException, match="was told to fail loading") as error:
        client.load_model("broken")
    assert error.value.status() == "400"
    with pytest.raises(InferenceServerException, match="Invalid config override: .*max_batch_size"):
        client.load_model("broken", config='{"max_batch_size": "one"}')


def test_explicit_mode_star_loads_everything(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    add_model("ident", IDENTITY)
    client = httpclient.InferenceServerClient(toy_server(model_control_mode="explicit", load_models=["*"]).http_url)
    assert client.is_model_ready("add_sub") and client.is_model_ready("ident")


def test_load_and_unload_are_refused_outside_explicit_mode(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("ident", IDENTITY)
    client = httpclient.InferenceServerClient(toy_server().http_url)
    for call in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException,
                           match="explicit model load / unload is not allowed if polling is enabled") as error:
            call("ident")
        assert error.value.status() == "503"
    assert client.is_model_ready("ident")


# ---- what the core fills in around auto-complete ------------------------------------------------

AUTO_FILLED = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def test_auto_complete_that_turns_batching_on_adds_the_dynamic_batcher(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("filled", 'backend: "toy_identity"', files={"1/toy_identity.toy": AUTO_FILLED})
    add_model("explicit", 'backend: "toy_identity"\nmax_batch_size: 4', files={"1/toy_identity.toy": AUTO_FILLED})
    client = httpclient.InferenceServerClient(toy_server().http_url)
    filled = client.get_model_config("filled")
    assert filled["max_batch_size"] == 8 and "dynamic_batching" in filled
    assert "dynamic_batching" not in client.get_model_config("explicit")  # the user chose max_batch_size


def test_other_model_filenames_identify_the_backend(add_model, tserve, repo) -> None:  # type: ignore[no-untyped-def]
    from triton_serve.plugin import BackendRegistry, hookimpl
    from triton_serve.testing import TOY_BACKENDS

    identity = next(b for b in TOY_BACKENDS if b.name == "toy_identity")
    second_file = type("SecondFile", (identity,), {"name": "toy_second_file",
                                                    "other_model_filenames": ("weights.bin",)})

    class Plugin:
        @hookimpl
        def tserve_register_backends(self, registry: BackendRegistry) -> None:
            registry.add(second_file)

    add_model("guessed", AUTO_FILLED, files={"1/weights.bin": ""})
    server = tserve(repo, extra_plugins=[("second", Plugin())])
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("guessed")
    assert config["backend"] == "toy_second_file"


@pytest.mark.parametrize(("kinds", "gpus", "expected"), [
    (("CPU",), [0], "KIND_CPU"),          # a CPU-only backend stays on the CPU
    (("CPU", "GPU"), [0], "KIND_GPU"),    # a GPU is visible and the backend runs there
    (("CPU", "GPU"), [], "KIND_CPU"),     # no GPU: the CPU
])
def test_kind_auto_follows_the_backend_and_the_gpus(kinds, gpus, expected, add_model, tserve, repo,  # type: ignore[no-untyped-def]
                                                    monkeypatch) -> None:
    from triton_serve.plugin import BackendRegistry, hookimpl
    from triton_serve.testing import TOY_BACKENDS

    pretend_gpus(monkeypatch, gpus)
    identity = next(b for b in TOY_BACKENDS if b.name == "toy_identity")
    kinded = type("Kinded", (identity,), {"name": "toy_kinded", "instance_kinds": kinds})

    class Plugin:
        @hookimpl
        def tserve_register_backends(self, registry: BackendRegistry) -> None:
            registry.add(kinded)

    add_model("auto", 'backend: "toy_kinded"\n' + AUTO_FILLED)
    server = tserve(repo, extra_plugins=[("kinded", Plugin())])
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("auto")
    assert config["instance_group"][0]["kind"] == expected


def test_scalar_per_batch_item_reshaped_to_dims_one(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("scalar", """
backend: "toy_identity"
max_batch_size: 2
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
""")
    client = httpclient.InferenceServerClient(toy_server().http_url)
    tensor = httpclient.InferInput("INPUT0", [2, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[2.5], [4.0]], np.float32))
    result = client.infer("scalar", [tensor])
    assert result.as_numpy("OUTPUT0").tolist() == [[2.5], [4.0]]


def test_an_empty_reshape_without_batching_is_tritons_error(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("scalar", """
backend: "toy_identity"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
""")
    index = httpclient.InferenceServerClient(toy_server().http_url).get_model_repository_index()
    assert index[0]["state"] == "UNAVAILABLE"
    assert ("model input 'INPUT0' cannot have empty reshape for non-batching model as scalar tensors are not "
            "supported for scalar") in index[0]["reason"]
