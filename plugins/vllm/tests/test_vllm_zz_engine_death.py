"""An engine process that dies fails its requests and makes the model unready, and vLLM's processes end with it;
the server goes on. Named to run last: it kills the session's engine (conftest.py)."""
from __future__ import annotations

import json
import os
import signal
import time

import httpx
import tritonclient.http as httpclient

from triton_serve.testing import RunningServer
from triton_serve_vllm.engine_client import EngineClient


MODEL = "llm"  # conftest.py's model
WAIT_S = 120


def test_a_dead_engine_fails_its_requests_and_the_model_goes_unready(server: RunningServer,
                                                                     engine: EngineClient) -> None:
    assert engine.pid is not None
    # a process group of its own (ended below as one), in the server's session (Linux schedules each session as
    # a group of its own: engine_client.py)
    assert os.getpgid(engine.pid) == engine.pid and os.getsid(engine.pid) == os.getsid(0)
    body = {"text_input": "Hello", "stream": True,
            "sampling_parameters": json.dumps({"max_tokens": 8000, "ignore_eos": True})}
    url = f"http://{server.http_url}/v2/models/{MODEL}/generate_stream"
    with httpx.stream("POST", url, json=body, timeout=WAIT_S) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: {")  # generating
        os.kill(engine.pid, signal.SIGKILL)
        events = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    assert "error" in events[-1] and "the vLLM engine process of vLLM model 'llm'" in events[-1]["error"]
    client = httpclient.InferenceServerClient(server.http_url)
    deadline = time.monotonic() + WAIT_S
    while client.is_model_ready(MODEL) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not client.is_model_ready(MODEL)
    assert client.is_server_live()
    while _group_alive(engine.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _group_alive(engine.pid)  # vLLM's engine core and worker processes went with it
    after = httpx.post(f"http://{server.http_url}/v2/models/{MODEL}/generate", json={"text_input": "Hi"},
                       timeout=WAIT_S)
    assert after.status_code in (400, 503) and "not ready" in after.json()["error"]


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
