"""Triton-style model.py files run unchanged and answer tritonclient.http correctly."""
from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as http

from triton_serve.testing import EXAMPLE_REPOSITORY, RunningServer

ADD_SUB = """
    import json
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.dtype = pb_utils.triton_string_to_numpy(
                pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"])

        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype)),
                    pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype))]))
            return responses
"""
ADD_SUB_CONFIG = """
    max_batch_size: 8
    input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 16 ] },
            { name: "INPUT1", data_type: TYPE_INT32, dims: [ 16 ] } ]
    output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 16 ] },
             { name: "OUTPUT1", data_type: TYPE_INT32, dims: [ 16 ] } ]
"""
IDENTITY_BYTES = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                        "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                    for r in requests]
"""
# No config.pbtxt at all: the backend is found from model.py, the rest comes from auto_complete_config.
AUTO_COMPLETE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            auto_complete_model_config.set_max_batch_size(4)
            auto_complete_model_config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [3]})
            auto_complete_model_config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [3]})
            return auto_complete_model_config

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                        "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * np.float32(2))])
                    for r in requests]
"""
ASYNC_EXECUTE = """
    import asyncio
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            await asyncio.sleep(0.01)
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                        "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + np.int64(1))])
                    for r in requests]
"""
INIT_ARGS = """
    import numpy as np
    import json
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.args = args
            self.model_dir = pb_utils.get_model_dir()  # as Triton's vLLM model.py reads its model.json

        def execute(self, requests):
            text = np.array([json.dumps(self.args).encode()], dtype=object)
            model_dir = np.array([self.model_dir.encode()], dtype=object)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", text),
                                                pb_utils.Tensor("MODEL_DIR", model_dir)]) for _ in requests]
"""
PARAMETERS = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                seen = json.loads(request.parameters())
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("Y", x)],
                    parameters={"echo": seen.get("greeting", ""), "count": 3, "flag": True,
                                "request_id": request.request_id()}))
            return responses
"""
# Echoes a large FP32 tensor through arenas that start at 1 MiB (the smallest Triton allows), so both must grow.
ECHO = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                        "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy().copy())])
                    for r in requests]
"""
LOGGING = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            pb_utils.Logger.log_info("initialized " + args["model_instance_name"])

        def execute(self, requests):
            logger = pb_utils.Logger
            logger.log_warn("a warning from execute")
            logger.log("an error from execute", logger.LogLevel.ERROR)
            logger.log_verbose("a verbose line")
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(1, np.int64))]) for _ in requests]
"""
INT64_X_Y = """
    max_batch_size: 0
    input [ { name: "X", data_type: TYPE_INT64, dims: [ -1 ] } ]
    output [ { name: "Y", data_type: TYPE_INT64, dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, kit: Any) -> Path:
    repo = tmp_path_factory.mktemp("serving")
    kit.write_model(repo, "add_sub", ADD_SUB, ADD_SUB_CONFIG)
    kit.write_model(repo, "identity_bytes", IDENTITY_BYTES, """
        max_batch_size: 8
        input [ { name: "INPUT0", data_type: TYPE_STRING, dims: [ -1 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_STRING, dims: [ -1 ] } ]
    """)
    kit.write_model(repo, "auto_complete", AUTO_COMPLETE)
    kit.write_model(repo, "async_execute", ASYNC_EXECUTE, INT64_X_Y)
    kit.write_model(repo, "init_args", INIT_ARGS, """
        output [ { name: "ARGS", data_type: TYPE_STRING, dims: [ 1 ] },
                 { name: "MODEL_DIR", data_type: TYPE_STRING, dims: [ 1 ] } ]
        instance_group [ { count: 1, kind: KIND_CPU } ]
    """)
    kit.write_model(repo, "parameters", PARAMETERS, INT64_X_Y)
    kit.write_model(repo, "echo", ECHO, """
        input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]
        output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]
        parameters { key: "shm-default-byte-size", value: { string_value: "1048576" } }
        parameters { key: "shm-growth-byte-size", value: { string_value: "65536" } }
    """)
    kit.write_model(repo, "logging", LOGGING, INT64_X_Y)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path, kit: Any) -> Iterator[RunningServer]:
    running = kit.start_server(repo, f"tsp_serving_{os.getpid()}_{uuid.uuid4().hex[:6]}_")
    yield running
    running.stop()


def test_all_models_are_ready(client: http.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    assert {entry["name"]: entry["state"] for entry in index} == {name: "READY" for name in (
        "add_sub", "identity_bytes", "auto_complete", "async_execute", "init_args", "parameters", "echo",
        "logging")}
    assert client.is_server_ready()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_add_sub(kit: Any, client: http.InferenceServerClient, binary: bool) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 5, dtype=np.int32)
    result = kit.infer(client, "add_sub", binary, INPUT0=a, INPUT1=b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bytes_identity(kit: Any, client: http.InferenceServerClient) -> None:
    text = np.array([[b"hello", b"", "w\u00f6rld".encode(), b"\x00\xffbinary"]], dtype=object)
    result = kit.infer(client, "identity_bytes", INPUT0=text)
    assert result.as_numpy("OUTPUT0").tolist() == text.tolist()


def test_auto_complete_config_fills_the_config(kit: Any, client: http.InferenceServerClient) -> None:
    config = client.get_model_config("auto_complete")
    assert config["backend"] == "python" and config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("X", "TYPE_FP32", [3])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("Y", "TYPE_FP32", [3])]
    x = np.array([[1, 2, 3]], dtype=np.float32)
    np.testing.assert_array_equal(kit.infer(client, "auto_complete", X=x).as_numpy("Y"), x * 2)


def test_async_execute(kit: Any, client: http.InferenceServerClient) -> None:
    x = np.array([1, 2, 3], dtype=np.int64)
    np.testing.assert_array_equal(kit.infer(client, "async_execute", X=x).as_numpy("Y"), x + 1)


def test_initialize_gets_the_seven_triton_arguments(client: http.InferenceServerClient, repo: Path) -> None:
    result = client.infer("init_args", [], outputs=[http.InferRequestedOutput("ARGS")])
    args = json.loads(result.as_numpy("ARGS")[0])
    assert sorted(args) == sorted(["model_config", "model_instance_kind", "model_instance_name",
                                   "model_instance_device_id", "model_repository", "model_version", "model_name"])
    assert args["model_name"] == "init_args" and args["model_version"] == "1"
    assert args["model_repository"] == str(repo / "init_args")
    assert args["model_instance_name"] == "init_args_0_0"
    assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
    config = json.loads(args["model_config"])
    assert config["name"] == "init_args" and config["output"][0]["name"] == "ARGS"


def test_get_model_dir_is_the_version_directory(client: http.InferenceServerClient, repo: Path) -> None:
    result = client.infer("init_args", [], outputs=[http.InferRequestedOutput("MODEL_DIR")])
    assert result.as_numpy("MODEL_DIR")[0].decode() == str(repo / "init_args" / "1")


def test_request_and_response_parameters(client: http.InferenceServerClient) -> None:
    x = http.InferInput("X", [2], "INT64")
    x.set_data_from_numpy(np.array([7, 8], dtype=np.int64))
    result = client.infer("parameters", [x], request_id="req-1", parameters={"greeting": "hi"})
    assert result.get_response()["parameters"] == {"echo": "hi", "count": 3, "flag": True, "request_id": "req-1"}


def test_tensors_larger_than_the_arenas(kit: Any, client: http.InferenceServerClient) -> None:
    x = np.random.default_rng(0).random(600_000, dtype=np.float32)  # 2.4 MB through 1 MiB arenas
    np.testing.assert_array_equal(kit.infer(client, "echo", X=x).as_numpy("Y"), x)
    small = np.array([1.5], dtype=np.float32)
    np.testing.assert_array_equal(kit.infer(client, "echo", X=small).as_numpy("Y"), small)


def test_logger_lines_reach_the_server_log(kit: Any, client: http.InferenceServerClient,
                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="triton_serve_python")
    kit.infer(client, "logging", X=np.zeros(1, np.int64))
    lines = {(r.levelno, f"{r.filename}:{r.lineno}] {r.getMessage()}") for r in caplog.records
             if r.name == "triton_serve_python.model"}  # at the model's file and line, as Triton logs them
    assert {(logging.WARNING, "model.py:11] a warning from execute"),
            (logging.ERROR, "model.py:12] an error from execute"),
            (logging.DEBUG, "model.py:13] a verbose line")} <= lines


def test_example_repository(kit: Any, python_server: Any, client_for: Any) -> None:
    client = client_for(python_server(EXAMPLE_REPOSITORY))
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = kit.infer(client, "add_sub", INPUT0=a, INPUT1=a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a * 0)
    text = np.array([[b"x", b"yz"]], dtype=object)
    assert kit.infer(client, "identity_bytes", INPUT0=text).as_numpy("OUTPUT0").tolist() == text.tolist()
    result = kit.infer(client, "tokenizer", TEXT=np.array([[b"Hello world"], [b"Serving models!"]], dtype=object))
    ids, lengths = result.as_numpy("TOKEN_IDS"), result.as_numpy("LENGTH")
    assert lengths.tolist() == [[4], [5]]
    assert ids.shape == (2, 5) and ids[0, -1] == 0  # the shorter row is padded with [PAD] = 0
    assert ids[0, 0] == ids[1, 0] == 2 and ids[0, 3] == ids[1, 4] == 3  # [CLS] ... [SEP]
    result = kit.infer(client, "bls_add_sub", INPUT0=a, INPUT1=a + 1)  # calls add_sub through BLS
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2 + 1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.full_like(a, -1))


def test_example_repository_over_grpc(python_server: Any) -> None:
    """tritonclient.grpc (sync, aio, and a stream) against the example repository."""
    import asyncio
    import queue

    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as grpcaio

    server = python_server(EXAMPLE_REPOSITORY)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)

    def add_sub_inputs(module: Any) -> list[Any]:
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        return inputs

    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_server_ready() and client.is_model_ready("tokenizer")
    assert client.get_model_config("add_sub").config.max_batch_size == 8
    np.testing.assert_array_equal(client.infer("add_sub", add_sub_inputs(grpcclient)).as_numpy("OUTPUT0"), a * 2)
    text = grpcclient.InferInput("INPUT0", [1, 2], "BYTES")
    text.set_data_from_numpy(np.array([[b"x", b"yz"]], dtype=object))
    assert client.infer("identity_bytes", [text]).as_numpy("OUTPUT0").tolist() == [[b"x", b"yz"]]

    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    for index in range(3):
        client.async_stream_infer("add_sub", add_sub_inputs(grpcclient), request_id=str(index))
    answers = [results.get(timeout=60) for _ in range(3)]
    client.stop_stream()
    client.close()
    assert [error for _, error in answers] == [None] * 3
    assert sorted(r.get_response().id for r, _ in answers) == ["0", "1", "2"]
    assert all((r.as_numpy("OUTPUT1") == 0).all() for r, _ in answers)

    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"stream these four tokens"], dtype=object))
    client.async_stream_infer("token_streamer", [text], enable_empty_final_response=True)
    tokens = []
    while True:
        result, error = results.get(timeout=60)
        assert error is None
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
        tokens.append(result.as_numpy("text_output")[0])
    client.stop_stream()
    client.close()
    assert tokens == [b"stream", b" these", b" four", b" tokens"]

    async def with_aio() -> list[Any]:
        aio = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            return await asyncio.gather(*(aio.infer("add_sub", add_sub_inputs(grpcaio)) for _ in range(4)))
        finally:
            await aio.close()

    assert all((r.as_numpy("OUTPUT0") == a * 2).all() for r in asyncio.run(with_aio()))
