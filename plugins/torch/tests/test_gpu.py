"""KIND_GPU serving; runs only where torch can use CUDA."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU that torch can use")]


@pytest.mark.parametrize("model_file", ["mlp_script", "mlp_exported"])
def test_kind_gpu_serves_on_the_gpu(repo, model_files, tserve, clients, kit, model_file):
    repo.add("on_gpu", getattr(model_files, model_file),
             kit.mlp_config(extra="instance_group [ { kind: KIND_GPU gpus: [0] } ]"))
    http_client, grpc_client = clients(tserve(repo.root))
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    y = np.random.default_rng(4).standard_normal((3, 3)).astype(np.float32)
    logits, hidden = kit.reference(model_files.mlp, x, y)
    for result in kit.infer(http_client, grpc_client, "on_gpu", INPUT__0=x, INPUT__1=y):
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), logits, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), hidden, rtol=1e-3, atol=1e-4)
