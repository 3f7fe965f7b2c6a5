"""Fixtures for the onnxruntime backend tests: ONNX models built at test time and written into tmp_path."""
from __future__ import annotations

import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
import tritonclient.grpc as grpc
import tritonclient.http as http
from onnx import TensorProto, helper

from triton_serve.testing import RunningServer
from triton_serve_onnx.session import load_gpu_libraries

IR_VERSION = 10  # onnx 1.23 writes IR 14 by default, newer than this onnxruntime reads
OPSET = 20

# ONNX element type of each Triton datatype (BYTES is an ONNX string tensor).
ONNX_TYPES = {
    "BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8, "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64, "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16, "INT32": TensorProto.INT32, "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def _graph_model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list[Any]]],
                 outputs: list[tuple[str, int, list[Any]]], initializers: list[onnx.TensorProto] = ()) -> bytes:
    graph = helper.make_graph(nodes, "test", [helper.make_tensor_value_info(*spec) for spec in inputs],
                              [helper.make_tensor_value_info(*spec) for spec in outputs], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model.SerializeToString()


class OnnxTestKit:
    """Model builders and helpers the tests reach through the ``kit`` fixture."""

    onnx_types = ONNX_TYPES

    # ---- models -------------------------------------------------------------------------------

    @staticmethod
    def identity_model(datatypes: list[str]) -> bytes:
        """``OUT_<T> = IN_<T>`` for each Triton datatype, every tensor of shape [N, 2]."""
        return _graph_model([helper.make_node("Identity", [f"IN_{t}"], [f"OUT_{t}"]) for t in datatypes],
                            [(f"IN_{t}", ONNX_TYPES[t], ["N", 2]) for t in datatypes],
                            [(f"OUT_{t}", ONNX_TYPES[t], ["N", 2]) for t in datatypes])

    @staticmethod
    def strings_model() -> bytes:
        """``SHOUT = TEXT + "!"`` element-wise on string tensors of shape [N, 2]."""
        suffix = helper.make_tensor("SUFFIX", TensorProto.STRING, [], [b"!"])
        return _graph_model([helper.make_node("StringConcat", ["TEXT", "SUFFIX"], ["SHOUT"])],
                            [("TEXT", TensorProto.STRING, ["N", 2])], [("SHOUT", TensorProto.STRING, ["N", 2])],
                            [suffix])

    @staticmethod
    def double_model(datatype: str = "FP32", shape: list[Any] | None = None) -> bytes:
        """``Y = X + X`` (default shape [N, L]: both dimensions variable)."""
        shape = shape if shape is not None else ["N", "L"]
        return _graph_model([helper.make_node("Add", ["X", "X"], ["Y"])],
                            [("X", ONNX_TYPES[datatype], shape)], [("Y", ONNX_TYPES[datatype], shape)])

    @staticmethod
    def add_model() -> bytes:
        """``Y = X + Z``, FP32 tensors of shape [N, L] and [N, M]: mismatched lengths fail inside onnxruntime."""
        return _graph_model([helper.make_node("Add", ["X", "Z"], ["Y"])],
                            [("X", TensorProto.FLOAT, ["N", "L"]), ("Z", TensorProto.FLOAT, ["N", "M"])],
                            [("Y", TensorProto.FLOAT, ["N", "L"])])

    @staticmethod
    def bf16_model() -> bytes:
        """``TO_BF16 = Cast(F32, bfloat16)`` and ``FROM_BF16 = Cast(B16, float)``, shapes [N, 2]."""
        return _graph_model([helper.make_node("Cast", ["F32"], ["TO_BF16"], to=TensorProto.BFLOAT16),
                             helper.make_node("Cast", ["B16"], ["FROM_BF16"], to=TensorProto.FLOAT)],
                            [("F32", TensorProto.FLOAT, ["N", 2]), ("B16", TensorProto.BFLOAT16, ["N", 2])],
                            [("TO_BF16", TensorProto.BFLOAT16, ["N", 2]), ("FROM_BF16", TensorProto.FLOAT, ["N", 2])])

    # ---- repositories -------------------------------------------------------------------------

    @staticmethod
    def write_model(repo: Path, name: str, model: bytes | None, config: str | None = None,
                    filename: str = "model.onnx") -> Path:
        """``<repo>/<name>/1/<filename>`` (unless ``model`` is None) and ``config.pbtxt`` (unless None)."""
        version_dir = repo / name / "1"
        version_dir.mkdir(parents=True)
        if model is not None:
            (version_dir / filename).parent.mkdir(parents=True, exist_ok=True)
            (version_dir / filename).write_bytes(model)
        if config is not None:
            (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
        return version_dir

    # ---- inference ----------------------------------------------------------------------------

    @staticmethod
    def reference(model: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs from onnxruntime run in-process on the CPU."""
        session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
        names = [output.name for output in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds), strict=True))

    @staticmethod
    def infer(client: http.InferenceServerClient | grpc.InferenceServerClient, model: str,
              datatypes: dict[str, str] | None = None, **arrays: np.ndarray) -> Any:
        """Infer over HTTP or gRPC (the client's module decides) with one input per keyword."""
        module = http if isinstance(client, http.InferenceServerClient) else grpc
        inputs = []
        for name, array in arrays.items():
            datatype = (datatypes or {}).get(name) or ("BYTES" if array.dtype.kind in "OSU"
                                                       else module.np_to_triton_dtype(array.dtype))
            tensor = module.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return client.infer(model, inputs)

    @staticmethod
    def reasons(client: http.InferenceServerClient) -> dict[str, str]:
        """Model name -> why it is not ready ("" when it is), from the repository index."""
        return {entry["name"]: entry.get("reason", "") for entry in client.get_model_repository_index()}


@pytest.fixture(scope="session")
def kit() -> type[OnnxTestKit]:
    return OnnxTestKit


@pytest.fixture(scope="session")
def mlp_model() -> bytes:
    """A 2-layer torch MLP (4 -> 8 -> 3) exported to ONNX with a dynamic batch dimension."""
    torch = pytest.importorskip("torch")

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = torch.nn.Linear(4, 8)
            self.out = torch.nn.Linear(8, 3)

        def forward(self, x: Any) -> Any:
            return self.out(torch.relu(self.hidden(x)))

    torch.manual_seed(0)
    with warnings.catch_warnings():
        # torch 2.13's exporter trips over its own deprecation of treespec.LeafSpec
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
        program = torch.onnx.export(MLP().eval(), (torch.randn(2, 4),), input_names=["INPUT0"],
                                    output_names=["OUTPUT0"], dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
                                    verbose=False)
    return program.model_proto.SerializeToString()


@pytest.fixture(scope="session")
def cuda_works() -> bool:
    """Whether onnxruntime can run a session on CUDAExecutionProvider here (it falls back to CPU if not)."""
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return False
    load_gpu_libraries()  # as the backend does before a GPU session
    session = onnxruntime.InferenceSession(OnnxTestKit.double_model(), providers=["CUDAExecutionProvider"])
    return "CUDAExecutionProvider" in session.get_providers()


@pytest.fixture
def clients() -> Iterator[Callable[[RunningServer], tuple[http.InferenceServerClient, grpc.InferenceServerClient]]]:
    """``clients(server)`` -> (HTTP client, gRPC client), closed at teardown."""
    made: list[Any] = []

    def make(server: RunningServer) -> tuple[http.InferenceServerClient, grpc.InferenceServerClient]:
        pair = (http.InferenceServerClient(server.http_url, network_timeout=120),
                grpc.InferenceServerClient(server.grpc_url))
        made.extend(pair)
        return pair

    yield make
    for client in made:
        client.close()
