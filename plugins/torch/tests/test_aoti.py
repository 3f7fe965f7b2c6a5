"""platform "torch_aoti" (Triton 2.67): an AOTInductor package compiled here (about 25 s on two cores, once per
session), served over HTTP and gRPC under Triton's forward-based and ordinal tensor names."""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="AOTInductor compiles the package with a C++ compiler (g++), not found here")


class Mixed(torch.nn.Module):
    """Two positional tensors and a keyword tensor in; a dict holding a tensor and a tuple out."""

    def forward(self, x: torch.Tensor, y: torch.Tensor, *, scale: torch.Tensor
                ) -> dict[str, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
        return {"sum": x + y, "pair": (x - y, x * scale)}


@pytest.fixture(scope="session")
def aoti_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("aoti") / "model.pt2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own deprecation and compile notices
        program = torch.export.export(Mixed(), (torch.zeros(1, 4), torch.zeros(1, 4)), {"scale": torch.zeros(1, 4)})
        torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    return path


def config(inputs: list[str], outputs: list[str]) -> str:
    tensors = lambda names: ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [1, 4] }}' for n in names)
    return (f'platform: "torch_aoti"\nmax_batch_size: 0\ninput [ {tensors(inputs)} ]\n'
            f'output [ {tensors(outputs)} ]\n')


def test_aoti_package_under_both_naming_conventions(  # type: ignore[no-untyped-def]
        repo, aoti_package, tserve, clients, kit):
    # forward-based names, listed out of order; and the ordinal names of the same tensors
    repo.add("named", aoti_package, config(["KWARGS[scale]", "ARGS[1]", "ARGS[0]"],
                                           ["RESULT[pair][1]", "RESULT[sum]", "RESULT[pair][0]"]))
    repo.add("ordinal", aoti_package, config(["INPUT__0", "INPUT__1", "INPUT__2"],
                                             ["OUTPUT__0", "OUTPUT__1", "OUTPUT__2"]))
    http_client, grpc_client = clients(tserve(repo.root))
    x = np.array([[1, 2, 3, 4]], np.float32)
    y = np.array([[0.5, 0.5, 2, 2]], np.float32)
    scale = np.array([[3, 3, 3, 3]], np.float32)
    for result in kit.infer(http_client, grpc_client, "named", **{"ARGS[0]": x, "ARGS[1]": y, "KWARGS[scale]": scale}):
        np.testing.assert_allclose(result.as_numpy("RESULT[sum]"), x + y)
        np.testing.assert_allclose(result.as_numpy("RESULT[pair][0]"), x - y)
        np.testing.assert_allclose(result.as_numpy("RESULT[pair][1]"), x * scale)
    for result in kit.infer(http_client, grpc_client, "ordinal", INPUT__0=x, INPUT__1=y, INPUT__2=scale):
        for name, expected in (("OUTPUT__0", x + y), ("OUTPUT__1", x - y), ("OUTPUT__2", x * scale)):
            np.testing.assert_allclose(result.as_numpy(name), expected)
    assert http_client.get_model_metadata("named")["platform"] == "torch_aoti"
