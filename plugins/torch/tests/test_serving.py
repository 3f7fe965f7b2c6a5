"""Serving TorchScript and exported models through tritonclient HTTP and gRPC; outputs match the module
run in-process on the same inputs."""
from __future__ import annotations

import concurrent.futures

import ml_dtypes
import numpy as np
import torch
import tritonclient.http as http

RNG = np.random.default_rng(7)


def mlp_inputs(batch: int) -> tuple[np.ndarray, np.ndarray]:
    return (RNG.standard_normal((batch, 4)).astype(np.float32), RNG.standard_normal((batch, 3)).astype(np.float32))


def test_named_index_convention_over_http_and_grpc(repo, model_files, tserve, clients, kit):
    repo.add("mlp", model_files.mlp_script, kit.mlp_config())
    http_client, grpc_client = clients(tserve(repo.root))
    x, y = mlp_inputs(3)
    logits, hidden = kit.reference(model_files.mlp, x, y)
    for result in kit.infer(http_client, grpc_client, "mlp", INPUT__0=x, INPUT__1=y):
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), logits, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), hidden, rtol=1e-5, atol=1e-6)


def test_forward_argument_names_bind_inputs_in_any_order(repo, model_files, tserve, clients, kit):
    # the config lists y before x: binding is by name, not by position
    config = """
        platform: "pytorch_libtorch"
        max_batch_size: 8
        input [ { name: "y" data_type: TYPE_FP32 dims: [3] }, { name: "x" data_type: TYPE_FP32 dims: [4] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [3] }, { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [8] } ]
        """
    repo.add("mlp", model_files.mlp_script, config)
    http_client, grpc_client = clients(tserve(repo.root))
    x, y = mlp_inputs(2)
    logits, hidden = kit.reference(model_files.mlp, x, y)
    for result in kit.infer(http_client, grpc_client, "mlp", x=x, y=y):
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), logits, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), hidden, rtol=1e-5, atol=1e-6)


def test_output_index_picks_the_tuple_element(repo, model_files, tserve, clients, kit):
    config = """
        platform: "pytorch_libtorch"
        max_batch_size: 8
        input [ { name: "x" data_type: TYPE_FP32 dims: [4] }, { name: "y" data_type: TYPE_FP32 dims: [3] } ]
        output [ { name: "HIDDEN__1" data_type: TYPE_FP32 dims: [8] } ]
        """
    repo.add("hidden_only", model_files.mlp_script, config)
    http_client, grpc_client = clients(tserve(repo.root))
    x, y = mlp_inputs(1)
    _, hidden = kit.reference(model_files.mlp, x, y)
    for result in kit.infer(http_client, grpc_client, "hidden_only", x=x, y=y):
        np.testing.assert_allclose(result.as_numpy("HIDDEN__1"), hidden, rtol=1e-5, atol=1e-6)


def test_other_names_bind_in_config_order(repo, model_files, tserve, clients, kit):
    repo.add("mlp", model_files.mlp_script, kit.mlp_config(x="features", y="scale", out0="logits", out1="hidden"))
    http_client, grpc_client = clients(tserve(repo.root))
    x, y = mlp_inputs(2)
    logits, hidden = kit.reference(model_files.mlp, x, y)
    for result in kit.infer(http_client, grpc_client, "mlp", features=x, scale=y):
        np.testing.assert_allclose(result.as_numpy("logits"), logits, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(result.as_numpy("hidden"), hidden, rtol=1e-5, atol=1e-6)


def test_every_datatype_with_variable_dims(repo, model_files, tserve, clients, kit):
    names = ["half", "brain", "count", "flag", "small", "byte", "double", "word"]
    types = ["FP16", "BF16", "INT64", "BOOL", "INT8", "UINT8", "FP64", "UINT16"]
    tensors = ", ".join(f'{{ name: "{n}" data_type: TYPE_{t} dims: [-1, -1] }}' for n, t in zip(names, types))
    outputs = ", ".join(f'{{ name: "OUT__{i}" data_type: TYPE_{t} dims: [-1, -1] }}' for i, t in enumerate(types))
    repo.add("dtypes", model_files.dtypes_script,
             f'backend: "pytorch"\ninput [ {tensors} ]\noutput [ {outputs} ]\n')
    http_client, grpc_client = clients(tserve(repo.root))
    for shape in ((2, 3), (1, 5)):  # variable dims: two shapes, one model
        arrays = {
            "half": RNG.standard_normal(shape).astype(np.float16),
            "brain": RNG.standard_normal(shape).astype(ml_dtypes.bfloat16),
            "count": RNG.integers(-1000, 1000, shape, dtype=np.int64),
            "flag": RNG.integers(0, 2, shape).astype(bool),
            "small": RNG.integers(-100, 100, shape, dtype=np.int8),
            "byte": RNG.integers(0, 200, shape, dtype=np.uint8),
            "double": RNG.standard_normal(shape),
            "word": RNG.integers(0, 30000, shape, dtype=np.uint16),
        }
        expected = kit.reference(model_files.dtypes, *arrays.values())
        for result in kit.infer(http_client, grpc_client, "dtypes", **arrays):
            for index, want in enumerate(expected):
                got = result.as_numpy(f"OUT__{index}")
                assert got.dtype == want.dtype and got.shape == shape, (index, got.dtype, got.shape)
                np.testing.assert_array_equal(got, want)


def test_two_instances_serve_concurrent_requests(repo, model_files, tserve, kit):
    repo.add("mlp", model_files.mlp_script,
             kit.mlp_config(extra="instance_group [ { count: 2 kind: KIND_CPU } ]"))
    server = tserve(repo.root)
    batches = [mlp_inputs(size) for size in (1, 2, 3, 4, 5, 6)]

    def infer(pair: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        with http.InferenceServerClient(server.http_url) as client:
            inputs = [http.InferInput(f"INPUT__{i}", list(a.shape), "FP32") for i, a in enumerate(pair)]
            for tensor, array in zip(inputs, pair):
                tensor.set_data_from_numpy(array)
            return client.infer("mlp", inputs).as_numpy("OUTPUT__0")

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(infer, batches))
    for (x, y), got in zip(batches, results):
        np.testing.assert_allclose(got, kit.reference(model_files.mlp, x, y)[0], rtol=1e-5, atol=1e-6)
    with http.InferenceServerClient(server.http_url) as client:
        assert client.get_model_config("mlp")["instance_group"][0]["count"] == 2


def test_exported_program_auto_completes_its_config(repo, model_files, tserve, clients, kit):
    repo.add("exported", model_files.mlp_exported, 'backend: "pytorch"\n')
    http_client, grpc_client = clients(tserve(repo.root))
    config = http_client.get_model_config("exported")
    assert config["max_batch_size"] == 4  # Triton's default-max-batch-size: the batch dim is dynamic
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [4]), ("y", "TYPE_FP32", [3])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("OUTPUT__0", "TYPE_FP32", [3]), ("OUTPUT__1", "TYPE_FP32", [8])]
    x, y = mlp_inputs(4)
    logits, hidden = kit.reference(model_files.mlp, x, y)
    for result in kit.infer(http_client, grpc_client, "exported", x=x, y=y):
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), logits, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), hidden, rtol=1e-5, atol=1e-6)


def test_exported_program_bounded_batch_limits_max_batch_size(repo, model_files, tserve, clients):
    repo.add("bounded", model_files.mlp_exported_bounded, 'platform: "pytorch_libtorch"\n')
    http_client, _ = clients(tserve(repo.root))
    assert http_client.get_model_config("bounded")["max_batch_size"] == 3


def test_auto_complete_fills_only_what_the_config_leaves_out(repo, model_files, tserve, clients):
    config = """
        backend: "pytorch"
        max_batch_size: 2
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [4] }, { name: "INPUT__1" data_type: TYPE_FP32 dims: [3] } ]
        """
    repo.add("outputs_missing", model_files.mlp_exported, config)
    http_client, _ = clients(tserve(repo.root))
    config = http_client.get_model_config("outputs_missing")
    assert config["max_batch_size"] == 2
    assert [t["name"] for t in config["input"]] == ["INPUT__0", "INPUT__1"]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("OUTPUT__0", [3]), ("OUTPUT__1", [8])]


class RowSums(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1)


def test_auto_complete_declares_a_scalar_per_row_the_triton_way(repo, tmp_path, tserve, clients, kit):
    program = kit.export(RowSums(), tmp_path / "sums.pt2", (torch.ones(2, 3),), torch.export.Dim("batch"))
    repo.add("sums", program, 'backend: "pytorch"')
    http_client, grpc_client = clients(tserve(repo.root))
    config = http_client.get_model_config("sums")
    (output,) = config["output"]
    assert (config["max_batch_size"], output["dims"], output["reshape"]) == (4, [1], {"shape": []})
    x = np.array([[1.5, 2, 3], [0, -1, 4]], np.float32)
    for result in kit.infer(http_client, grpc_client, "sums", x=x):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), [[6.5], [3]])


def test_exported_program_with_a_written_config(repo, model_files, tserve, clients, kit):
    repo.add("exported", model_files.mlp_exported, kit.mlp_config(), filename="model.pt2")
    http_client, grpc_client = clients(tserve(repo.root, disable_auto_complete_config=True))
    x, y = mlp_inputs(5)
    logits, hidden = kit.reference(model_files.mlp, x, y)
    for result in kit.infer(http_client, grpc_client, "exported", INPUT__0=x, INPUT__1=y):
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), logits, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), hidden, rtol=1e-5, atol=1e-6)


def test_default_model_filename_is_honoured(repo, model_files, tserve, clients, kit):
    repo.add("renamed", model_files.mlp_script,
             kit.mlp_config(extra='default_model_filename: "weights.ts"'), filename="weights.ts")
    http_client, grpc_client = clients(tserve(repo.root))
    x, y = mlp_inputs(1)
    for result in kit.infer(http_client, grpc_client, "renamed", INPUT__0=x, INPUT__1=y):
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), kit.reference(model_files.mlp, x, y)[0],
                                   rtol=1e-5, atol=1e-6)
