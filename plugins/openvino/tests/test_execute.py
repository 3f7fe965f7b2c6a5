"""One ``execute`` call with several requests (as a dynamic batcher sends them), and the batcher end to end."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

MLP = """
    backend: "openvino"
    max_batch_size: 8
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [4] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [3] }]
"""


def ir_files(path: Path) -> dict[str, Path]:
    return {"model.xml": path, "model.bin": path.with_suffix(".bin")}


def test_requests_of_different_batch_sizes_run_as_one_batch_and_split_back(
        repo: Path, models: dict[str, Path], kit: Any) -> None:
    instance = kit.loaded_instance(kit.spec(kit.write_model(repo, "mlp", ir_files(models["mlp_xml"])), MLP))
    rng = np.random.default_rng(8)
    batches = [{"INPUT0": rng.normal(size=(n, 4)).astype(np.float32)} for n in (1, 3, 2)]
    responses = kit.execute(instance, batches)
    assert len(responses) == 3
    for batch, response in zip(batches, responses, strict=True):
        output = response.output("OUTPUT0")
        assert output.datatype == "FP32" and output.shape == (len(batch["INPUT0"]), 3)
        expected = kit.reference(models["mlp_xml"], batch)["OUTPUT0"]
        np.testing.assert_allclose(output.data, expected, rtol=1e-5, atol=1e-6)


def test_each_request_gets_the_outputs_it_asked_for(repo: Path, models: dict[str, Path], kit: Any) -> None:
    model_dir = kit.write_model(repo, "ints", ir_files(models["ints_xml"]))
    instance = kit.loaded_instance(kit.spec(model_dir, 'backend: "openvino"'))
    rng = np.random.default_rng(9)
    batches = [{"A": rng.integers(0, 9, (n, 3), dtype=np.int32), "B": rng.integers(0, 9, (n, 3), dtype=np.int32),
                "H": np.ones((n, 3), np.float16)} for n in (2, 1)]
    first = kit.execute(instance, batches, outputs=["SUM"])
    assert [[t.name for t in response.outputs] for response in first] == [["SUM"], ["SUM"]]
    for batch, response in zip(batches, first, strict=True):
        np.testing.assert_array_equal(response.output("SUM").data, batch["A"] + batch["B"])
    [every] = kit.execute(instance, batches[:1])
    assert [t.name for t in every.outputs] == ["SUM", "GREATER", "WIDE", "HALF"]


def test_dynamic_batching_end_to_end(tserve: Any, repo: Path, models: dict[str, Path], kit: Any) -> None:
    pytest.importorskip("triton_serve_batching")
    kit.write_model(repo, "batched", ir_files(models["mlp_xml"]),
                    MLP + "dynamic_batching { max_queue_delay_microseconds: 2000000 }\n")
    server = tserve(repo)
    rng = np.random.default_rng(10)
    batches = [rng.normal(size=(n, 4)).astype(np.float32) for n in (1, 2, 3)]

    def run(x: np.ndarray) -> np.ndarray:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        try:
            tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            return client.infer("batched", [tensor]).as_numpy("OUTPUT0")
        finally:
            client.close()

    with ThreadPoolExecutor(len(batches)) as pool:
        results = list(pool.map(run, batches))
    for x, got in zip(batches, results, strict=True):
        np.testing.assert_allclose(got, kit.reference(models["mlp_xml"], {"INPUT0": x})["OUTPUT0"],
                                   rtol=1e-5, atol=1e-6)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        [stats] = client.get_inference_statistics("batched")["model_stats"]
    finally:
        client.close()
    # the batcher handed the three requests to one execute call, which ran them as one batch of 6
    assert (stats["execution_count"], stats["inference_count"]) == (1, 6)
    assert [entry["batch_size"] for entry in stats["batch_stats"]] == [6]
