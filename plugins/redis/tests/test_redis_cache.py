"""The redis response cache against a real redis-server, through tritonclient: servers share entries, the cache
metrics count hits and misses, a Redis that dies mid-run leaves requests served uncached, bad keys fail the start."""
from __future__ import annotations

import logging
import re
import time

import httpx
import numpy as np
import pytest
import redis as redis_py
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import triton_serve_redis.cache
from triton_serve.plugin import InferenceResponse, ServerError, Tensor
from triton_serve.testing import free_port
from triton_serve_redis.codec import UnreadableEntry, decode, encode

FRONTEND_MODES = [0, 2]  # front-ends in the server's process, and two front-end processes


def infer(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient, value: int) -> int:
    """toy_count's answer to INPUT0 = value: the executions of its model folder when it ran, whoever ran it."""
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return int(client.infer("counter", [tensor]).as_numpy("OUTPUT0")[0])


def wait_for_keys(client: redis_py.Redis, count: int) -> list[bytes]:
    """The cache's keys once there are ``count`` (inserts go to Redis after the response)."""
    deadline = time.monotonic() + 10
    while True:
        keys: list[bytes] = sorted(client.keys("tserve:*"))  # type: ignore[arg-type]  # sync client: a list
        if len(keys) >= count or time.monotonic() > deadline:
            return keys
        time.sleep(0.01)


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url, timeout=10).text
    selector = ",".join(f'{key}="{value}"' for key, value in labels.items())
    found = re.search(rf"^{name}{{{re.escape(selector)}}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES)
def test_two_servers_answer_from_each_others_entries(redis_server, cached_server,  # type: ignore[no-untyped-def]
                                                     frontend_processes: int) -> None:
    redis = redis_server()
    first = cached_server(redis.options, frontend_processes=frontend_processes)
    second = cached_server(redis.options, frontend_processes=frontend_processes)
    http = httpclient.InferenceServerClient(first.http_url)
    grpc = grpcclient.InferenceServerClient(second.grpc_url)
    store = redis.client()

    assert infer(http, 7) == 1  # a miss: the first server runs it
    [key] = wait_for_keys(store, 1)
    assert re.fullmatch(rb"tserve:[0-9a-f]{64}", key)
    assert infer(grpc, 7) == 1  # the second server answers with the first one's response
    assert infer(grpc, 8) == 1  # another input: the second server's first execution
    wait_for_keys(store, 2)
    assert infer(http, 8) == 1  # the first answers with the second's (its own run would say 2)
    assert infer(http, 7) == 1

    for server, hits in ((first, 2), (second, 1)):
        labels = {"model": "counter", "version": "1"}
        assert metric(server.metrics_url, "nv_cache_num_hits_per_model", **labels) == hits
        assert metric(server.metrics_url, "nv_cache_num_misses_per_model", **labels) == 1
        assert metric(server.metrics_url, "nv_inference_exec_count", **labels) == 1
        assert metric(server.metrics_url, "nv_inference_request_success", **labels) == hits + 1
        assert metric(server.metrics_url, "nv_cache_hit_duration_per_model", **labels) > 0


def test_requests_are_served_uncached_while_redis_is_down(  # type: ignore[no-untyped-def]
        redis_server, cached_server, caplog, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_serve_redis.cache, "RETRY_AFTER_S", 60.0)
    redis = redis_server()
    server = cached_server(redis.options)
    client = httpclient.InferenceServerClient(server.http_url)
    errors = {"operation": "lookup"}
    assert infer(client, 7) == 1
    wait_for_keys(redis.client(), 1)
    assert infer(client, 7) == 1  # a hit
    assert metric(server.metrics_url, "tserve_redis_cache_errors_total", **errors) == 0

    redis.kill()
    with caplog.at_level(logging.INFO, logger="triton_serve_redis"):
        assert [infer(client, 7) for _ in range(3)] == [2, 3, 4]  # served, uncached
        # One failed lookup; the next requests did not wait on Redis for RETRY_AFTER_S.
        assert metric(server.metrics_url, "tserve_redis_cache_errors_total", **errors) == 1
        monkeypatch.setattr(triton_serve_redis.cache, "RETRY_AFTER_S", 0.0)
        server.server.dataplane.cache._retry_at = 0.0  # the 60 s are over: every request asks Redis again
        assert [infer(client, 7) for _ in range(2)] == [5, 6]
        assert metric(server.metrics_url, "tserve_redis_cache_errors_total", **errors) == 3
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings  # one per outage, not one per request
        assert warnings[0].startswith(f"the redis response cache at 127.0.0.1:{redis.port} failed (")

        redis.start()  # back, empty, on the same port: the next request reconnects
        assert infer(client, 7) == 7
        assert wait_for_keys(redis.client(), 1), "no entry stored once Redis was back"
    assert any(r.getMessage().endswith("answers again") for r in caplog.records)


@pytest.mark.parametrize(("options", "message"), ids=["no port", "bad port", "unknown key", "bad timeout", "bad tls"],
                         argvalues=[
    ({"host": "127.0.0.1"}, "Failed to initialize RedisCache, didn't specify address. Must at a minimum specify "
                            "'host' and 'port'"),
    ({"host": "127.0.0.1", "port": "http"}, "--cache-config redis: 'port' must be a port number (1 to 65535), "
                                            "got 'http'"),
    ({"host": "127.0.0.1", "port": "6379", "timeout": "5"}, "--cache-config redis: unknown key 'timeout'"),
    ({"host": "127.0.0.1", "port": "6379", "socket_timeout": "-1"}, "'socket_timeout' must be a whole number of "
                                                                    "milliseconds"),
    ({"host": "127.0.0.1", "port": "6379", "tls_enabled": "yes please"}, "'tls_enabled' must be true or false"),
])
def test_a_malformed_cache_config_fails_the_start_naming_the_key(  # type: ignore[no-untyped-def]
        cached_server, options: dict[str, str], message: str) -> None:
    with pytest.raises(ServerError, match=re.escape(message)):
        cached_server(options)


def test_an_unreachable_redis_fails_the_start_as_triton(cached_server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ServerError, match="^Failed to initialize RedisCache: .*Connection refused"):
        cached_server({"host": "127.0.0.1", "port": str(free_port())})


def test_credentials_from_the_config_or_tritons_environment_variables(  # type: ignore[no-untyped-def]
        redis_server, cached_server, monkeypatch: pytest.MonkeyPatch) -> None:
    redis = redis_server("--user", "triton", "on", ">secret", "~tserve:*", "+get", "+set", "+ping", "+hello",
                         "+keys")
    with pytest.raises(ServerError, match="^Failed to initialize RedisCache: "):
        cached_server({**redis.options, "user": "triton", "password": "wrong"})
    monkeypatch.setenv("TRITONCACHE_REDIS_USERNAME", "triton")
    monkeypatch.setenv("TRITONCACHE_REDIS_PASSWORD", "secret")
    client = httpclient.InferenceServerClient(cached_server(redis.options).http_url)
    assert infer(client, 7) == 1
    assert wait_for_keys(redis.client(username="triton", password="secret"), 1)
    monkeypatch.delenv("TRITONCACHE_REDIS_PASSWORD")
    other = httpclient.InferenceServerClient(cached_server({**redis.options, "password": "secret"}).http_url)
    assert infer(other, 7) == 1  # the other server's entry


def test_tls_with_tritons_keys(redis_server, cached_server, tls_files) -> None:  # type: ignore[no-untyped-def]
    redis = redis_server("--port", "0", "--tls-port", "{port}", "--tls-cert-file", str(tls_files / "server.crt"),
                         "--tls-key-file", str(tls_files / "server.key"), "--tls-ca-cert-file",
                         str(tls_files / "ca.crt"), "--tls-auth-clients", "yes")
    tls = {**redis.options, "tls_enabled": "true", "cacert": str(tls_files / "ca.crt"),
           "cert": str(tls_files / "client.crt"), "key": str(tls_files / "client.key")}
    assert infer(httpclient.InferenceServerClient(cached_server(tls).http_url), 7) == 1
    for ca in ({"cacert": str(tls_files / "ca.crt")}, {"cacert_dir": str(tls_files)}):
        # Another server with the CA as a file or a folder answers from the first one's entry.
        settings = {key: value for key, value in tls.items() if key not in ("cacert", "cacert_dir")}
        assert infer(httpclient.InferenceServerClient(cached_server({**settings, **ca}).http_url), 7) == 1
    without_certificate = {key: value for key, value in tls.items() if key not in ("cert", "key")}
    with pytest.raises(ServerError, match="^Failed to initialize RedisCache: "):
        cached_server(without_certificate)  # the server asks for a client certificate


def test_entries_round_trip_every_kind_of_output() -> None:
    strings = np.array([b"a", b"", "é".encode()], dtype=np.object_).reshape(3, 1)
    response = InferenceResponse([
        Tensor("TEXT", "BYTES", (3, 1), strings, {"note": "kept"}),
        Tensor("HALF", "FP16", (2,), np.array([1.5, -2], np.float16)),
        Tensor("BIG", "INT64", (2, 2), np.arange(4, dtype=">i8").reshape(2, 2)),  # big-endian: stored little
    ], {"sequence_id": 3})
    back = decode(encode(response))
    assert [(t.name, t.datatype, t.shape, t.parameters) for t in back.outputs] == \
        [(t.name, t.datatype, t.shape, t.parameters) for t in response.outputs]
    assert back.outputs[0].data.tolist() == strings.tolist()
    assert back.outputs[1].data.tolist() == [1.5, -2]
    assert back.outputs[2].data.tolist() == [[0, 1], [2, 3]]
    assert back.parameters == {"sequence_id": 3}
    for garbage in (b"", b"hello world", encode(response)[:-3]):
        with pytest.raises(UnreadableEntry):
            decode(garbage)
