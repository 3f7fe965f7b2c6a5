"""--model-namespacing: two repositories hold a model of one name; a request naming it alone is ambiguous,
each repository's ensemble uses its own repository's model, load and unload reach every repository's."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.testing import RunningServer

from .conftest import FRONTEND_MODES, write_model

AMBIGUOUS = ("There are 2 identifiers of model 'shared' in global map, model namespace must be provided to "
             "resolve ambiguity.")


def _tensor(name: str) -> str:
    return f'{{ name: "{name}" data_type: TYPE_INT32 dims: [ 2 ] }}'


def _config(backend: str, inputs: list[str], outputs: list[str]) -> str:
    return (f'backend: "{backend}"\nmax_batch_size: 0\ninput [ {", ".join(map(_tensor, inputs))} ]\n'
            f'output [ {", ".join(map(_tensor, outputs))} ]\n')


def _ensemble(inputs: dict[str, str], model: str) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    return (f'platform: "ensemble"\nmax_batch_size: 0\ninput [ {", ".join(map(_tensor, inputs.values()))} ]\n'
            f'output [ {_tensor("OUT")} ]\nensemble_scheduling {{ step [ {{ model_name: "{model}" '
            f'model_version: -1{maps} output_map {{ key: "OUTPUT0" value: "OUT" }} }} ] }}\n')


@pytest.fixture
def repositories(tmp_path: Path) -> tuple[Path, Path]:
    """repo_a: 'shared' adds (OUTPUT0 = INPUT0 + INPUT1), 'only_a', and ensemble 'ens_a' over 'shared'.
    repo_b: 'shared' is the identity (one input), ensemble 'ens_b' over 'shared' and 'ens_b_only_a' over
    'only_a', which only repo_a holds."""
    repo_a, repo_b = tmp_path / "repo_a", tmp_path / "repo_b"
    write_model(repo_a, "shared", _config("toy_add_sub", ["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"]))
    write_model(repo_a, "only_a", _config("toy_identity", ["INPUT0"], ["OUTPUT0"]))
    write_model(repo_a, "ens_a", _ensemble({"INPUT0": "A", "INPUT1": "B"}, "shared"))
    write_model(repo_b, "shared", _config("toy_identity", ["INPUT0"], ["OUTPUT0"]))
    write_model(repo_b, "ens_b", _ensemble({"INPUT0": "A"}, "shared"))
    write_model(repo_b, "ens_b_only_a", _ensemble({"INPUT0": "A"}, "only_a"))
    return repo_a, repo_b


def _start(tserve: Callable[..., RunningServer], toy_plugin: Any, repositories: tuple[Path, Path],
           **options: Any) -> RunningServer:
    return tserve(*repositories, extra_plugins=[("toy", toy_plugin)], model_namespacing=True, allow_metrics=False,
                  **options)


def _infer(client: Any, module: Any, model: str, **arrays: np.ndarray) -> np.ndarray:
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer(model, inputs)
    return np.asarray(result.as_numpy("OUT" if model.startswith("ens") else "OUTPUT0"))


@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_names_resolve_per_repository(tserve: Callable[..., RunningServer], toy_plugin: Any,
                                      repositories: tuple[Path, Path], protocol: str, frontend_processes: int) -> None:
    server = _start(tserve, toy_plugin, repositories, frontend_processes=frontend_processes)
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    a, b = np.array([1, 2], dtype=np.int32), np.array([10, 20], dtype=np.int32)
    try:
        assert list(_infer(client, module, "only_a", INPUT0=a)) == [1, 2]
        assert list(_infer(client, module, "ens_a", A=a, B=b)) == [11, 22]  # repo_a's 'shared' adds
        assert list(_infer(client, module, "ens_b", A=a)) == [1, 2]  # repo_b's is the identity
        assert list(_infer(client, module, "ens_b_only_a", A=b)) == [10, 20]  # the only 'only_a'
        for call in (lambda: _infer(client, module, "shared", INPUT0=a), lambda: client.get_model_metadata("shared")):
            with pytest.raises(InferenceServerException) as raised:
                call()
            assert raised.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
            assert AMBIGUOUS in str(raised.value)
        assert not client.is_model_ready("shared")
    finally:
        client.close()


def test_load_and_unload_reach_each_repositorys_model(tserve: Callable[..., RunningServer], toy_plugin: Any,
                                                     repositories: tuple[Path, Path]) -> None:
    server = _start(tserve, toy_plugin, repositories, model_control_mode="explicit")
    client = httpclient.InferenceServerClient(server.http_url)

    def ready() -> list[str]:
        return sorted(entry["name"] for entry in client.get_model_repository_index() if entry.get("state") == "READY")

    try:
        assert [entry["name"] for entry in client.get_model_repository_index()].count("shared") == 2
        client.load_model("ens_b")  # loads repo_b's 'shared' only: the name is not ambiguous yet
        assert ready() == ["ens_b", "shared"]
        assert list(_infer(client, httpclient, "shared", INPUT0=np.array([3, 4], dtype=np.int32))) == [3, 4]
        client.load_model("shared")  # both repositories' models of that name
        assert ready() == ["ens_b", "shared", "shared"]
        client.unload_model("shared")  # both, and the ensemble that uses one
        assert ready() == []
    finally:
        client.close()


def test_poll_follows_each_repositorys_copy(tserve: Callable[..., RunningServer], toy_plugin: Any,
                                            repositories: tuple[Path, Path]) -> None:
    """A model leaving one repository while the other keeps its name: only that repository's copy unloads,
    and the name is no longer ambiguous."""
    server = _start(tserve, toy_plugin, repositories, model_control_mode="poll", repository_poll_secs=3600)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        for model in ("ens_a", "shared"):
            (repositories[0] / model / "config.pbtxt").unlink()
            (repositories[0] / model / "1").rmdir()
            (repositories[0] / model).rmdir()
        poller = server.server.poller
        assert poller is not None
        server.call(poller.poll)
        assert list(_infer(client, httpclient, "shared", INPUT0=np.array([5, 6], dtype=np.int32))) == [5, 6]
        assert sorted(entry["name"] for entry in client.get_model_repository_index()).count("shared") == 1
    finally:
        client.close()
