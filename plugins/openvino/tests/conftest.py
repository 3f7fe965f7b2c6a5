"""Fixtures for the openvino backend tests: tiny models built at test time, repositories, reference runs."""
from __future__ import annotations

import asyncio
import importlib.metadata
import shutil
import textwrap
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest
from google.protobuf import text_format

from triton_serve.plugin import (InferenceRequest, InferenceResponse, InstanceSpec, ModelConfig, ModelSpec,
                                 RequestedOutput, ServerOptions, Tensor, datatype_of, model_parameters)
from triton_serve.testing import ENTRY_POINT_GROUP, PLUGINS_ENV, RunningServer, apply_defaults, free_port
from triton_serve_openvino.backend import OpenVinoBackend
from triton_serve_openvino.instance import OpenVinoInstance


class OpenVinoKit:
    """Helpers the tests reach through the ``kit`` fixture (test modules import nothing from here)."""

    @staticmethod
    def write_model(repo: Path, name: str, files: dict[str, Path | bytes], config: str | None = None) -> Path:
        """``<repo>/<name>/1/<file>`` for each file (copied, or written from bytes) and the config text."""
        version_dir = repo / name / "1"
        version_dir.mkdir(parents=True)
        for filename, source in files.items():
            if isinstance(source, bytes):
                (version_dir / filename).write_bytes(source)
            else:
                shutil.copyfile(source, version_dir / filename)
        if config is not None:
            (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
        return repo / name

    @staticmethod
    def start_server(repo: Path, **options: Any) -> RunningServer:
        """A server outside the ``tserve`` fixture, for module-scoped servers (stop it yourself)."""
        for key in ("http_port", "grpc_port", "metrics_port"):
            options.setdefault(key, free_port())
        for key in ("http_address", "grpc_address", "metrics_address"):
            options.setdefault(key, "127.0.0.1")
        return RunningServer(ServerOptions(model_repositories=[str(repo)], **options))

    @staticmethod
    def reference(model_file: Path, inputs: dict[str, np.ndarray], reshape: dict[str, list[int]] | None = None,
                  properties: dict[str, str] | None = None) -> dict[str, np.ndarray]:
        """The model file run in-process by OpenVINO (default CPU properties unless given): output name -> array."""
        core = ov.Core()
        model = core.read_model(str(model_file))
        if reshape:
            model.reshape({name: ov.PartialShape(shape) for name, shape in reshape.items()})
        results = core.compile_model(model, "CPU", properties or {}).create_infer_request().infer(inputs)
        return {port.get_any_name(): np.array(array) for port, array in results.items()}

    @staticmethod
    def spec(model_dir: Path, config_text: str, backend: OpenVinoBackend | None = None) -> ModelSpec:
        """The ModelSpec the server would build for version 1: auto-completed, defaulted."""
        config = text_format.Parse(textwrap.dedent(config_text), ModelConfig())
        spec = ModelSpec(model_dir.name, 1, config, model_dir, model_dir / "1", OpenVinoBackend.default_model_filename)
        backend = backend or OpenVinoBackend()
        spec.parameters = model_parameters(backend, spec)
        backend.auto_complete_config(spec)
        apply_defaults(config, model_dir.name)
        return spec

    @staticmethod
    def loaded_instance(spec: ModelSpec) -> OpenVinoInstance:
        """One CPU instance of ``spec``, loaded (with its model)."""
        model = OpenVinoBackend().create_model(spec)
        asyncio.run(model.load())
        instance = model.create_instance(InstanceSpec(f"{spec.name}_0", spec.config.instance_group[0], 0, "CPU"))
        assert isinstance(instance, OpenVinoInstance)
        asyncio.run(instance.load())
        return instance

    @staticmethod
    def execute(instance: OpenVinoInstance, batches: Sequence[dict[str, np.ndarray]],
                outputs: Sequence[str] = ()) -> list[InferenceResponse]:
        """Run one ``execute`` call with one request per entry of ``batches`` (input name -> array)."""
        async def run() -> list[InferenceResponse]:
            requests = []
            for arrays in batches:
                tensors = {name: Tensor(name, datatype_of(array), tuple(array.shape), array)
                           for name, array in arrays.items()}
                requests.append(InferenceRequest(instance.model.spec.name, inputs=tensors,
                                                 outputs=[RequestedOutput(name) for name in outputs]))
            return list(await instance.execute(requests))

        return asyncio.run(run())


@pytest.fixture(scope="module", autouse=True)
def only_this_plugin() -> Iterator[None]:
    """Servers started here load only the openvino plugin (and the batcher, when installed), so
    another plugin that is broken or half-installed cannot fail these tests."""
    installed = {entry.name for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    names = ["openvino", *(name for name in ("batching",) if name in installed)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(PLUGINS_ENV, ",".join(names))
        yield


@pytest.fixture(scope="session")
def kit() -> type[OpenVinoKit]:
    return OpenVinoKit


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model files built once per session:

    - ``mlp_onnx``: a torch MLP (4 -> 8 -> 3, ReLU) exported to ONNX with a dynamic batch axis;
      input ``INPUT0`` FP32 [-1, 4], output ``OUTPUT0`` FP32 [-1, 3].
    - ``mlp_xml``: the same converted to OpenVINO IR (``model.xml``, weights in ``model.bin`` beside it).
    - ``static_xml``: the same IR with its batch fixed at 1.
    - ``ints_xml``: an IR built from opset ops: A, B INT32 [-1, 3], H FP16 [-1, 3] ->
      SUM = A + B (INT32), GREATER = A > B (BOOL), WIDE = A * B as INT64, HALF = H * 0.5 (FP16).
    """
    import torch

    root = tmp_path_factory.mktemp("openvino_models")
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    onnx_path = root / "mlp.onnx"
    with warnings.catch_warnings():  # torch's exporter warns about its own internals
        warnings.simplefilter("ignore")
        torch.onnx.export(mlp, (torch.randn(2, 4),), str(onnx_path), input_names=["INPUT0"],
                          output_names=["OUTPUT0"], dynamic_shapes=({0: torch.export.Dim("batch")},),
                          dynamo=True, external_data=False, verbose=False)
    paths = {"mlp_onnx": onnx_path}
    converted = ov.convert_model(str(onnx_path))
    (root / "mlp").mkdir()
    paths["mlp_xml"] = root / "mlp" / "model.xml"
    ov.save_model(converted, str(paths["mlp_xml"]))
    converted.reshape({"INPUT0": ov.PartialShape([1, 4])})
    (root / "static").mkdir()
    paths["static_xml"] = root / "static" / "model.xml"
    ov.save_model(converted, str(paths["static_xml"]))
    (root / "ints").mkdir()
    paths["ints_xml"] = root / "ints" / "model.xml"
    ov.save_model(_typed_model(), str(paths["ints_xml"]))
    return paths


def _typed_model() -> ov.Model:
    a = ops.parameter([-1, 3], ov.Type.i32, name="A")
    b = ops.parameter([-1, 3], ov.Type.i32, name="B")
    h = ops.parameter([-1, 3], ov.Type.f16, name="H")
    outputs = {
        "SUM": ops.add(a, b),
        "GREATER": ops.greater(a, b),
        "WIDE": ops.multiply(ops.convert(a, ov.Type.i64), ops.convert(b, ov.Type.i64)),
        "HALF": ops.multiply(h, ops.constant(np.array([0.5], np.float16))),
    }
    for name, node in outputs.items():
        node.output(0).set_names({name})
    return ov.Model([node.output(0) for node in outputs.values()], [a, b, h], "typed")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path
