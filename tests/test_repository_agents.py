"""Repository agents: ``model_repository_agents`` in config.pbtxt, the built-in checksum agent and a plugin's own
agents, seen through tritonclient's model control."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.plugin import AgentAction, AgentModel, RepositoryAgent, RepositoryAgentRegistry, hookimpl

WEIGHTS = "weights.bin"


def _config(*agents: str) -> str:
    return ('backend: "toy_identity"\nmax_batch_size: 0\n'
            'input { name: "INPUT0" data_type: TYPE_FP32 dims: [1] }\n'
            'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }\n'
            'model_repository_agents { agents [' + ", ".join(agents) + "] }")


def _checksum(**digests: str) -> str:
    parameters = ", ".join(f'{{ key: "{key}" value: "{value}" }}' for key, value in digests.items())
    return f'{{ name: "checksum", parameters [{parameters}] }}'


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _infer(client: httpclient.InferenceServerClient, model: str) -> float:
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([2.5], dtype=np.float32))
    return float(client.infer(model, [tensor]).as_numpy("OUTPUT0")[0])


def test_checksum_agent_checks_files_and_a_mismatch_keeps_the_serving_version(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    model_dir = add_model("m", _config(_checksum(**{f"MD5:{WEIGHTS}": _md5("v1")})), files={WEIGHTS: "v1"})
    server = toy_server(model_control_mode="explicit", load_models=["m"])
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("m") and _infer(client, "m") == 2.5
    (model_dir / WEIGHTS).write_text("tampered")
    with pytest.raises(InferenceServerException) as failed:
        client.load_model("m")
    assert (f"failed to load 'm', failed to poll from model repository: Mismatched MD5 hash for file {WEIGHTS}, "
            f"expect: {_md5('v1')}, got: {_md5('tampered')}") in str(failed.value)
    assert client.is_model_ready("m") and _infer(client, "m") == 2.5  # the previous load keeps serving
    (model_dir / WEIGHTS).write_text("v1")
    client.load_model("m")
    assert client.is_model_ready("m")


@pytest.mark.parametrize("agents, message", [
    (_checksum(**{"nocolon": "x"}), "failed to parse key: nocolon"),
    (_checksum(**{"SHA1:weights.bin": "x"}), "Unsupported checksum algorithm: SHA1"),
    (_checksum(**{"MD5:missing.bin": "x"}), "failed to open text file for read missing.bin: "),
    ('{ name: "encryption" }', "unable to find repository agent 'encryption' for model 'm'"),
])
def test_bad_agent_settings_fail_the_load_naming_them(add_model, toy_server, agents, message) -> None:  # type: ignore[no-untyped-def]
    add_model("m", _config(agents), files={WEIGHTS: "v1"})
    server = toy_server(model_control_mode="explicit")
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match=message):
        client.load_model("m")
    assert not client.is_model_ready("m")


class _Recorder(RepositoryAgent):
    """Copies the model into its own directory with new weights (as a decrypting agent would), and records
    each action and the location it saw."""

    calls: list[tuple[str, str, str]] = []

    def __init__(self, label: str) -> None:
        self.label = label

    def model_action(self, model: AgentModel, action: AgentAction) -> None:
        self.calls.append((self.label, action.name, str(model.location)))
        if action is AgentAction.LOAD and model.parameters.get("rewrite"):
            copy = model.acquire_mutable_location() / "model"
            shutil.copytree(model.location, copy)
            (copy / WEIGHTS).write_text(model.parameters["rewrite"])
            model.set_location(copy)


class _AgentsPlugin:
    @hookimpl
    def tserve_register_repository_agents(self, registry: RepositoryAgentRegistry) -> None:
        registry.add("first", lambda: _Recorder("first"))
        registry.add("second", lambda: _Recorder("second"))


def test_agents_run_in_order_and_see_the_location_the_one_before_set(repo, toy_plugin, tserve) -> None:  # type: ignore[no-untyped-def]
    from .conftest import write_model

    write_model(repo, "m", _config('{ name: "first", parameters { key: "rewrite" value: "decrypted" } }',
                                   '{ name: "second" }', _checksum(**{f"MD5:{WEIGHTS}": _md5("decrypted")})),
                files={WEIGHTS: "encrypted"})
    _Recorder.calls.clear()
    server = tserve(repo, extra_plugins=[("toy", toy_plugin), ("agents", _AgentsPlugin())],
                    model_control_mode="explicit", load_models=["m"])
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("m") and _infer(client, "m") == 2.5  # checksum saw the rewritten weights
    client.unload_model("m")
    calls = _Recorder.calls
    actions = [(label, action) for label, action, _ in calls]
    assert actions == [("first", "LOAD"), ("second", "LOAD"), ("second", "LOAD_COMPLETE"), ("first", "LOAD_COMPLETE"),
                       ("first", "UNLOAD"), ("second", "UNLOAD"), ("second", "UNLOAD_COMPLETE"),
                       ("first", "UNLOAD_COMPLETE")]
    rewritten = Path(calls[1][2])
    assert calls[0][2] == str(repo / "m") and rewritten.name == "model" and rewritten != repo / "m"
    assert not rewritten.exists()  # the agent's mutable location is gone after UNLOAD_COMPLETE


def _agent_override(key: str, digest: str) -> str:
    return json.dumps({"backend": "toy_identity", "max_batch_size": 0,
                       "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
                       "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
                       "model_repository_agents": {"agents": [{"name": "checksum", "parameters": {key: digest}}]}})


@pytest.fixture
def fifo(repo: Path) -> Iterator[Path]:
    """A FIFO in model ``m``'s folder; teardown opens it for writing and closes it, releasing a reader stuck on it."""
    path = repo / "m" / "pipe"
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    yield path
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader waits on it


def test_checksum_agent_reads_only_files_inside_the_model_folder(add_model, toy_server, repo,  # type: ignore[no-untyped-def]
                                                                  tmp_path) -> None:
    """Paths named through a load override that lead outside the folder (absolute, ``..``, a link out, a link to a
    device) are refused without the file's content or digest in the answer; a link that stays inside is read."""
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    add_model("m", _config(), files={WEIGHTS: "v1"})
    (repo / "m" / "out.bin").symlink_to(secret)
    (repo / "m" / "1" / "in.bin").symlink_to(Path("..") / WEIGHTS)
    (repo / "m" / "1" / "dev").symlink_to("/dev/zero")
    server = toy_server(model_control_mode="explicit")
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    for relative in (str(secret), f"../../{secret.parent.name}/secret.txt", "out.bin", "1/../../m/../../secret.txt",
                     "/proc/self/environ", "1/dev"):
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("m", config=_agent_override(f"MD5:{relative}", "0" * 32))
        message = str(refused.value)
        assert f"failed to open text file for read {relative}: the path leads outside the model's directory" in message
        assert _md5("top secret") not in message and "got:" not in message
        assert not client.is_model_ready("m")
    client.load_model("m", config=_agent_override("MD5:1/in.bin", _md5("v1")))
    assert client.is_model_ready("m") and _infer(client, "m") == 2.5


def test_checksum_agent_refuses_a_fifo_at_once_and_the_model_loads_again(add_model, toy_server, fifo) -> None:  # type: ignore[no-untyped-def]
    add_model("m", _config(), files={WEIGHTS: "v1"})
    server = toy_server(model_control_mode="explicit")
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=20)
    with pytest.raises(InferenceServerException, match="failed to open text file for read pipe: not a regular file"):
        client.load_model("m", config=_agent_override("MD5:pipe", "0" * 32))
    client.load_model("m", config=_agent_override(f"MD5:{WEIGHTS}", _md5("v1")))
    assert client.is_model_ready("m") and _infer(client, "m") == 2.5
