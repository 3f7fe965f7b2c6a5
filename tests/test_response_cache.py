"""The response cache: --cache-config picks a cache plugin; models opt in with response_cache { enable: true }."""
from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np
import pytest
import tritonclient.http as httpclient

from triton_serve._engine.builtins.local_cache import LocalResponseCache
from triton_serve._engine.caching import ResponseCache
from triton_serve._engine.cli import build_parser, options_from_args
from triton_serve._engine.errors import ServerError
from triton_serve._engine.hookspecs import hookimpl
from triton_serve._engine.inference import InferenceResponse, Tensor
from triton_serve._engine.registry import CacheRegistry

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
    with pytest.raises(ServerError, match="--cache-config names cache 'memcached', which no installed plugin provides"):
        tserve(repo, cache_config=("memcached", {}))


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


def test_cache_config_flags_gather_their_keys_as_triton() -> None:
    def cache_config(*flags: str) -> tuple[str, dict[str, str]] | None:
        return options_from_args(build_parser().parse_args(list(flags))).cache_config

    assert cache_config("--cache-config=redis,host=redis", "--cache-config", "redis,port=6379") == \
        ("redis", {"host": "redis", "port": "6379"})
    assert cache_config() is None
    with pytest.raises(ServerError, match="--cache-config names caches 'local', 'redis': one cache at a time"):
        cache_config("--cache-config=local,size=1024", "--cache-config=redis,host=redis")


class _RemoteDict(ResponseCache):
    """A remote cache as the data plane sees one: ``fetch`` is awaited; ``fail`` makes it break its promise."""

    remote = True
    fail = False

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)
        self.entries: dict[str, InferenceResponse] = {}

    def lookup(self, key: str) -> InferenceResponse | None:
        raise AssertionError("a remote cache is asked through fetch")

    async def fetch(self, key: str) -> InferenceResponse | None:
        await asyncio.sleep(0.001)
        if self.fail:
            raise RuntimeError("the remote cache broke")
        return self.entries.get(key)

    def insert(self, key: str, response: InferenceResponse) -> None:
        self.entries[key] = response


class _RemoteDictPlugin:
    @hookimpl
    def tserve_register_caches(self, registry: CacheRegistry) -> None:
        registry.add("remote_dict", _RemoteDict)


def test_a_remote_cache_is_awaited_and_its_failures_leave_requests_uncached(  # type: ignore[no-untyped-def]
        add_model, tserve, repo, toy_plugin, monkeypatch: pytest.MonkeyPatch) -> None:
    add_model("cached", COUNTER + "response_cache { enable: true }")
    client = httpclient.InferenceServerClient(tserve(
        repo, extra_plugins=[("toy", toy_plugin), ("remote", _RemoteDictPlugin())],
        cache_config=("remote_dict", {})).http_url)
    assert [_executions(client, "cached", 7) for _ in range(3)] == [1, 1, 1]
    assert _executions(client, "cached", 8) == 2
    monkeypatch.setattr(_RemoteDict, "fail", True)
    assert [_executions(client, "cached", 7) for _ in range(2)] == [3, 4]  # served, uncached
