"""The response cache: --cache-config picks a cache plugin; models opt in with response_cache { enable: true }."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from triton_serve._engine.builtins.local_cache import LocalResponseCache
from triton_serve._engine.errors import ServerError
from triton_serve._engine.inference import InferenceResponse, Tensor

COUNTER = """
backend: "toy_count"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }
output { name: "OUTPUT0" data_type: TYPE_INT64 dims: [ 1 ] }
"""


def _executions(client: httpclient.InferenceServerClient, model: str, value: int) -> int:
    tensor = httpclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return int(client.infer(model, [tensor]).as_numpy("OUTPUT0")[0])


def test_identical_requests_are_answered_from_the_cache(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("cached", COUNTER + "response_cache { enable: true }")
    add_model("uncached", COUNTER)
    client = httpclient.InferenceServerClient(toy_server(cache_config=("local", {"size": "1048576"})).http_url)
    assert [_executions(client, "cached", 7) for _ in range(3)] == [1, 1, 1]  # executed once
    assert _executions(client, "cached", 8) == 2  # other input: a miss
    assert [_executions(client, "uncached", 7) for _ in range(2)] == [1, 2]  # not opted in


def test_without_cache_config_nothing_is_cached(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("cached", COUNTER + "response_cache { enable: true }")
    client = httpclient.InferenceServerClient(toy_server().http_url)
    assert [_executions(client, "cached", 7) for _ in range(2)] == [1, 2]


def test_unknown_cache_is_a_start_up_error(tserve, repo) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ServerError, match="--cache-config names cache 'redis', which no installed plugin provides"):
        tserve(repo, cache_config=("redis", {}))


def test_local_cache_evicts_least_recently_used() -> None:
    cache = LocalResponseCache({"size": "16"})
    entry = lambda: InferenceResponse([Tensor("O", "INT32", (2,), np.zeros(2, np.int32))])  # noqa: E731
    cache.insert("a", entry())
    cache.insert("b", entry())
    assert cache.lookup("a") is not None  # a is now the most recent
    cache.insert("c", entry())  # 24 bytes > 16: evicts b
    assert cache.lookup("b") is None and cache.lookup("a") is not None and cache.lookup("c") is not None
    with pytest.raises(ServerError, match="size must be a byte count"):
        LocalResponseCache({"size": "lots"})
