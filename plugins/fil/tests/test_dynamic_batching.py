"""With the dynamic batcher installed, concurrent requests batched into one execute each get their own rows."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import xgboost

from triton_serve.testing import RunningServer


def test_concurrent_requests_are_split_back_correctly(tmp_path: Path, kit: Any, trained: Any,
                                                       server_for: Callable[..., RunningServer]) -> None:
    pytest.importorskip("triton_serve_batching")
    booster = trained.xgb_multiclass
    config = kit.config("xgboost_json", [3], output_class="true", predict_proba="true",
                        extra="dynamic_batching { max_queue_delay_microseconds: 2000000 }\n")
    kit.write_model(tmp_path, "batched", config, {"xgboost.json": kit.save_xgboost(booster, "json")})
    server = server_for(tmp_path, "triton_serve_fil", "triton_serve_batching")
    batches = [kit.rows(size, seed=size) for size in (1, 2, 3)]
    client = httpclient.InferenceServerClient(server.http_url, concurrency=3)
    try:
        pending = []
        for rows in batches:
            tensor = httpclient.InferInput("input__0", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            pending.append(client.async_infer("batched", [tensor]))
        outputs = [request.get_result().as_numpy("output__0") for request in pending]
    finally:
        client.close()
    for rows, output in zip(batches, outputs):
        np.testing.assert_allclose(output, booster.predict(xgboost.DMatrix(rows)), rtol=1e-5, atol=1e-6)
