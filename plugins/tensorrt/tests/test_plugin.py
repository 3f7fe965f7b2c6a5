"""The plugin as installed: entry point, registration, and behaviour on a machine without TensorRT
(reason in `triton-serve plugins`, failed loads in the repository index, other models still served)."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from triton_serve.plugin import InstanceSpec, ModelInstanceGroup, ModelSpec, ServerError
from triton_serve.testing import PLUGINS_ENV, PluginHost
from triton_serve_tensorrt.backend import INSTALL_COMMAND, TensorRTBackend
from tritonclient.utils import InferenceServerException

without_tensorrt = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None,
                                      reason="TensorRT is installed here; these tests describe a machine without it")

IDENTITY = """
backend: "toy_identity"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def test_the_entry_point_names_the_plugin_module() -> None:
    points = {point.name: point.value for point in importlib.metadata.entry_points(group="triton_serve")}
    assert points.get("tensorrt") == "triton_serve_tensorrt.plugin"


def test_the_plugin_registers_the_backend_and_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLUGINS_ENV, "tensorrt")
    host = PluginHost()
    assert host.backends.get("tensorrt") is TensorRTBackend
    assert host.backends.owner("tensorrt") == "tensorrt"
    assert host.backends.backend_name_for("", "tensorrt_plan") == "tensorrt"
    assert TensorRTBackend.default_model_filename == "model.plan"


@without_tensorrt
def test_without_tensorrt_the_backend_says_why_and_how_to_install() -> None:
    reason = TensorRTBackend().unavailable_reason()
    assert reason is not None
    assert reason.startswith("TensorRT is not installed (import tensorrt failed: No module named 'tensorrt')")
    assert INSTALL_COMMAND == "pip install 'triton-serve-tensorrt[tensorrt]'" and INSTALL_COMMAND in reason


@pytest.mark.parametrize("kind", [ModelInstanceGroup.KIND_CPU, ModelInstanceGroup.KIND_MODEL])
def test_non_gpu_instances_are_refused(kit: Any, tmp_path: Path, kind: int) -> None:
    group = ModelInstanceGroup(name="cpu_group", kind=kind, count=1)
    spec = ModelSpec("resnet", 1, kit.config(name="resnet"), tmp_path, tmp_path / "1", "model.plan")
    kind_name = ModelInstanceGroup.Kind.Name(kind).removeprefix("KIND_")
    with pytest.raises(ServerError) as caught:
        TensorRTBackend().create_model(spec).create_instance(InstanceSpec("cpu_group_0", group, 0, kind_name))
    assert caught.value.message == (f"model 'resnet': instance group 'cpu_group' is KIND_{kind_name}, but TensorRT "
                                    "engines run only on GPUs; use kind: KIND_GPU")


@without_tensorrt
def test_triton_serve_plugins_lists_the_backend_as_unavailable() -> None:
    command = [str(Path(sys.executable).parent / "triton-serve"), "plugins"]  # this interpreter's, not PATH's
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, PLUGINS_ENV: "tensorrt"})
    assert result.returncode == 0, result.stderr
    assert "tensorrt  (triton-serve-tensorrt 0.1.0)" in result.stdout
    line = next(line for line in result.stdout.splitlines() if line.startswith("backend tensorrt:"))
    assert line.startswith("backend tensorrt: unavailable: TensorRT is not installed")
    assert INSTALL_COMMAND in line and line.endswith("(from plugin 'tensorrt')")


def write_model(repo: Path, name: str, config: str | None, files: dict[str, bytes]) -> None:
    (repo / name / "1").mkdir(parents=True)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    for filename, data in files.items():
        (repo / name / "1" / filename).write_bytes(data)


@without_tensorrt
def test_tensorrt_models_fail_to_load_with_the_reason_while_others_serve(
        repo: Path, tserve, toy_plugin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLUGINS_ENV, "tensorrt")
    write_model(repo, "by_platform", 'platform: "tensorrt_plan"\nmax_batch_size: 8', {"model.plan": b"not a plan"})
    write_model(repo, "by_file", None, {"model.plan": os.urandom(64)})
    write_model(repo, "identity", IDENTITY, {})
    server = tserve(repo, extra_plugins=[("toy", toy_plugin)])

    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for index in (http.get_model_repository_index(), grpc.get_model_repository_index(as_json=True)["models"]):
            states = {entry["name"]: entry for entry in index}
            assert states["identity"]["state"] == "READY"
            for name in ("by_platform", "by_file"):
                assert states[name]["state"] == "UNAVAILABLE"
                reason = states[name]["reason"]
                assert reason.startswith(f"failed to load '{name}': backend 'tensorrt' is unavailable: "
                                         "TensorRT is not installed")
                assert INSTALL_COMMAND in reason
        assert not http.is_model_ready("by_platform") and not grpc.is_model_ready("by_file")
        assert not http.is_server_ready()  # strict readiness: a model that should load did not

        data = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
        http_input = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        http_input.set_data_from_numpy(data)
        np.testing.assert_array_equal(http.infer("identity", [http_input]).as_numpy("OUTPUT0"), data)
        grpc_input = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        grpc_input.set_data_from_numpy(data)
        np.testing.assert_array_equal(grpc.infer("identity", [grpc_input]).as_numpy("OUTPUT0"), data)

        with pytest.raises(InferenceServerException) as caught:
            http.infer("by_platform", [http_input])
        assert caught.value.status() == "404" and "'by_platform'" in str(caught.value.message())
    finally:
        http.close()
        grpc.close()
