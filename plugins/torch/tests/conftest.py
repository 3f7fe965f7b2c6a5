"""Fixtures for the pytorch backend tests: small torch models saved at test time, and repositories of them."""
from __future__ import annotations

import shutil
import textwrap
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpc
import tritonclient.http as http

from triton_serve.testing import RunningServer


class TwoHeadMLP(torch.nn.Module):
    """forward(x [B,4], y [B,3]) -> (logits [B,3], hidden [B,8]): two inputs, a tuple of two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.relu(self.hidden(x))
        return self.head(hidden) * y, hidden


class EveryDtype(torch.nn.Module):
    """Element-wise work on one tensor of each dtype; shapes pass through, so any dims work."""

    def forward(self, half: torch.Tensor, brain: torch.Tensor, count: torch.Tensor, flag: torch.Tensor,
                small: torch.Tensor, byte: torch.Tensor, double: torch.Tensor, word: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor, torch.Tensor]:
        return (half * 2, brain * 2, count * 3 + 1, ~flag, small - 1, byte + 1, double / 4, word * 2)


def script(module: torch.nn.Module, path: Path) -> Path:
    """Save ``module`` as TorchScript; torch >= 2.10 marks torch.jit deprecated, which is no news here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=DeprecationWarning)
        torch.jit.script(module).save(str(path))
    return path


def export(module: torch.nn.Module, path: Path, example: tuple[torch.Tensor, ...],
           batch: torch.export.Dim | None = None) -> Path:
    """Save ``module`` as an exported program with the first dim of every input dynamic (``batch``)."""
    dynamic = tuple({0: batch} for _ in example) if batch is not None else None
    torch.export.save(torch.export.export(module, example, dynamic_shapes=dynamic), str(path))
    return path


@dataclass
class ModelFiles:
    """Model files built once per test session, and the eager modules they were saved from."""

    mlp: TwoHeadMLP
    mlp_script: Path
    mlp_exported: Path
    mlp_exported_bounded: Path  # batch dim at most 3
    dtypes: EveryDtype
    dtypes_script: Path


@pytest.fixture(scope="session")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    folder = tmp_path_factory.mktemp("torch_models")
    torch.manual_seed(0)
    mlp = TwoHeadMLP().eval()
    example = (torch.randn(2, 4), torch.randn(2, 3))
    return ModelFiles(
        mlp=mlp,
        mlp_script=script(mlp, folder / "mlp.pt"),
        mlp_exported=export(mlp, folder / "mlp.pt2", example, torch.export.Dim("batch")),
        mlp_exported_bounded=export(mlp, folder / "mlp_bounded.pt2", example, torch.export.Dim("batch", max=3)),
        dtypes=EveryDtype(),
        dtypes_script=script(EveryDtype(), folder / "dtypes.pt"),
    )


class Repository:
    """A model repository in tmp_path: ``add(name, model_file, config)`` writes ``<name>/1/<file>``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, name: str, model_file: Path | bytes | None, config: str | None,
            filename: str | None = None) -> Path:
        version = self.root / name / "1"
        version.mkdir(parents=True)
        if isinstance(model_file, Path):
            shutil.copy(model_file, version / (filename or f"model{model_file.suffix}"))
        elif model_file is not None:
            (version / (filename or "model.pt")).write_bytes(model_file)
        if config is not None:
            (self.root / name / "config.pbtxt").write_text(textwrap.dedent(config))
        return version


@pytest.fixture
def repo(tmp_path: Path) -> Repository:
    return Repository(tmp_path / "models")


MLP_CONFIG = """
    platform: "pytorch_libtorch"
    max_batch_size: 8
    input [ {{ name: "{x}" data_type: TYPE_FP32 dims: [4] }}, {{ name: "{y}" data_type: TYPE_FP32 dims: [3] }} ]
    output [ {{ name: "{out0}" data_type: TYPE_FP32 dims: [3] }}, {{ name: "{out1}" data_type: TYPE_FP32 dims: [8] }} ]
    """


class TorchTestKit:
    """Helpers the tests reach through the ``kit`` fixture (test modules import nothing from here)."""

    script = staticmethod(script)
    export = staticmethod(export)

    @staticmethod
    def mlp_config(x: str = "INPUT__0", y: str = "INPUT__1", out0: str = "OUTPUT__0", out1: str = "OUTPUT__1",
                   extra: str = "") -> str:
        """The two-head MLP's config with these tensor names (listed in this order), plus ``extra`` lines."""
        return textwrap.dedent(MLP_CONFIG.format(x=x, y=y, out0=out0, out1=out1)) + textwrap.dedent(extra)

    @staticmethod
    def reference(module: torch.nn.Module, *arrays: np.ndarray) -> list[np.ndarray]:
        """The module run in-process on the same inputs (BF16 inputs as torch.bfloat16)."""
        tensors = [torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == ml_dtypes.bfloat16
                   else torch.from_numpy(a) for a in arrays]
        with torch.inference_mode():
            result = module(*tensors)
        return [t.float().numpy().astype(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()
                for t in (result if isinstance(result, tuple) else (result,))]

    @staticmethod
    def infer(http_client: http.InferenceServerClient, grpc_client: grpc.InferenceServerClient, model: str,
              **arrays: np.ndarray) -> tuple[http.InferResult, grpc.InferResult]:
        """Send the same inputs (name=array, datatypes from the arrays) over binary HTTP and over gRPC."""
        results = []
        for module, client in ((http, http_client), (grpc, grpc_client)):
            inputs = []
            for name, array in arrays.items():
                tensor = module.InferInput(name, list(array.shape), module.np_to_triton_dtype(array.dtype))
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            results.append(client.infer(model, inputs))
        return results[0], results[1]

    @staticmethod
    def load_failure(http_client: http.InferenceServerClient, model: str) -> str:
        """The reason the repository index gives for a model that failed to load."""
        for entry in http_client.get_model_repository_index():
            if entry["name"] == model:
                assert entry.get("state") == "UNAVAILABLE", entry
                return entry["reason"]
        raise AssertionError(f"model '{model}' is not in the repository index")


@pytest.fixture(scope="session")
def kit() -> type[TorchTestKit]:
    return TorchTestKit


@pytest.fixture
def clients() -> Iterator[Callable[[RunningServer], tuple[http.InferenceServerClient, grpc.InferenceServerClient]]]:
    """``clients(server)``: an HTTP and a gRPC client for a running server, closed at teardown."""
    made: list[http.InferenceServerClient | grpc.InferenceServerClient] = []

    def make(server: RunningServer) -> tuple[http.InferenceServerClient, grpc.InferenceServerClient]:
        pair = (http.InferenceServerClient(server.http_url), grpc.InferenceServerClient(server.grpc_url))
        made.extend(pair)
        return pair

    yield make
    for client in made:
        client.close()
