"""A Python model's own is_ready() (Triton 26.03): asked by every model-ready check, over HTTP and gRPC."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpc

CONFIG = """
max_batch_size: 0
input [{ name: "X", data_type: TYPE_FP32, dims: [ 2 ] }]
output [{ name: "Y", data_type: TYPE_FP32, dims: [ 2 ] }]
"""
# Ready while the file named in its parameter exists; answers Y = X regardless.
FLAG_MODEL = """
import json, os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.flag = os.path.join(args["model_repository"], "ready.flag")

    def is_ready(self):
        return os.path.exists(self.flag)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""
PLAIN_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""
ASYNC_FALSE = PLAIN_MODEL + """
    async def is_ready(self):
        return False
"""
RAISES = PLAIN_MODEL + """
    def is_ready(self):
        raise RuntimeError("the feature store is down")
"""
NOT_BOOL = PLAIN_MODEL + """
    def is_ready(self):
        return 1
"""


@pytest.mark.parametrize("frontend_processes", [0, 2], ids=lambda count: f"frontend_processes={count}")
def test_is_ready_decides_model_readiness(kit: Any, python_server: Any, client_for: Any, tmp_path: Path,
                                          frontend_processes: int) -> None:
    for name, source in (("flag", FLAG_MODEL), ("plain", PLAIN_MODEL), ("async_false", ASYNC_FALSE),
                         ("raises", RAISES), ("not_bool", NOT_BOOL)):
        kit.write_model(tmp_path, name, source, CONFIG)
    flag = tmp_path / "flag" / "ready.flag"
    flag.touch()
    server = python_server(tmp_path, frontend_processes=frontend_processes)
    http_client = client_for(server)
    grpc_client = grpc.InferenceServerClient(server.grpc_url)
    try:
        # loaded, but strict readiness asks each model's is_ready(), as Triton 2.67 does
        assert not http_client.is_server_ready() and not grpc_client.is_server_ready()
        assert http_client.is_model_ready("flag") and grpc_client.is_model_ready("flag")
        assert http_client.is_model_ready("plain") and grpc_client.is_model_ready("plain", "1")
        for name in ("async_false", "raises", "not_bool"):
            assert not http_client.is_model_ready(name), name
            assert not grpc_client.is_model_ready(name), name

        flag.unlink()  # asked at each check: the answer follows the model at once
        assert not http_client.is_model_ready("flag") and not grpc_client.is_model_ready("flag", "1")
        x = np.array([1.0, 2.0], np.float32)
        assert (kit.infer(http_client, "flag", X=x).as_numpy("Y") == x).all()  # readiness does not stop inference
        flag.touch()
        assert http_client.is_model_ready("flag") and grpc_client.is_model_ready("flag")
    finally:
        grpc_client.close()
