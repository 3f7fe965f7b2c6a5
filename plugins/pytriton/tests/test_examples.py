"""PyTriton-shaped scripts (tests/examples/, written like PyTriton's add_sub, identity,
multi-instance, streaming and dynamic-batching examples, imports changed) run unchanged otherwise,
served by triton-serve, and answer tritonclient over HTTP and gRPC."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_serve.testing import free_port

EXAMPLES = Path(__file__).parent / "examples"


# Runs the script as a terminal would start it: Ctrl+C (SIGINT) unblocked and raising KeyboardInterrupt, whatever
# the test process's own signal state is (a child inherits ignored and blocked signals).
_AS_FROM_A_TERMINAL = ("import os, runpy, signal, sys; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
                       "signal.signal(signal.SIGINT, signal.default_int_handler); sys.argv = sys.argv[1:]; "
                       "sys.path[0] = os.path.dirname(sys.argv[0]); runpy.run_path(sys.argv[0], run_name='__main__')")


class Example:
    """A script serving in a subprocess on free ports (given through PyTriton's environment variables)."""

    def __init__(self, script: str, model: str) -> None:
        self.model = model
        self.http_port, self.grpc_port, metrics_port = free_port(), free_port(), free_port()
        environment = dict(os.environ, PYTRITON_TRITON_CONFIG_HTTP_PORT=str(self.http_port),
                           PYTRITON_TRITON_CONFIG_GRPC_PORT=str(self.grpc_port),
                           PYTRITON_TRITON_CONFIG_METRICS_PORT=str(metrics_port),
                           PYTRITON_TRITON_CONFIG_HTTP_ADDRESS="127.0.0.1",
                           PYTRITON_TRITON_CONFIG_GRPC_ADDRESS="127.0.0.1",
                           PYTRITON_TRITON_CONFIG_METRICS_ADDRESS="127.0.0.1")
        # Its output goes to a file, not a pipe: a pipe nobody reads until the end fills, and then blocks the
        # script (its server logs a line per request at some log levels).
        self.output = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "-c", _AS_FROM_A_TERMINAL, str(EXAMPLES / script)],
                                        env=environment, stdout=self.output, stderr=subprocess.STDOUT)
        self.http = httpclient.InferenceServerClient(f"127.0.0.1:{self.http_port}")
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc_port}")
        self.made: list[object] = [self.http, self.grpc]
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                self.process.wait(timeout=10)
                output = self._read_output()
                raise AssertionError(f"{script} did not become ready:\n{output}")
            time.sleep(0.1)

    def clients(self) -> list[tuple[object, object]]:
        """A new HTTP client and a new gRPC client with their modules (one per thread: tritonclient's
        HTTP client is not for several threads at once)."""
        made = [(httpclient, httpclient.InferenceServerClient(f"127.0.0.1:{self.http_port}", network_timeout=30)),
                (grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc_port}"))]
        self.made.extend(client for _, client in made)
        return made

    def _ready(self) -> bool:
        try:
            return bool(self.http.is_model_ready(self.model))  # bind loads it once the server runs
        except Exception:  # not listening yet
            return False

    def _read_output(self) -> str:
        self.output.seek(0)
        text = self.output.read().decode(errors="replace")
        self.output.close()
        return text

    def stop(self, signum: signal.Signals = signal.SIGINT) -> str:
        """SIGINT (Ctrl+C, as a user stops PyTriton's serve()) or SIGTERM (as docker and Kubernetes stop it); the
        script must exit cleanly."""
        for client in self.made:
            client.close()  # type: ignore[attr-defined]
        self.process.send_signal(signum)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            raise AssertionError(f"the script did not stop within 30 s of {signum.name}:\n{self._read_output()}") from None
        output = self._read_output()
        assert self.process.returncode == 0, output
        return output


@pytest.fixture
def example() -> Iterator[Callable[[str, str], Example]]:
    started: list[Example] = []

    def start(script: str, model: str) -> Example:
        started.append(Example(script, model))
        return started[-1]

    yield start
    for running in started:
        if running.process.poll() is None:
            running.stop()
        running.output.close()


def _inputs(module: object, **arrays: np.ndarray) -> list[object]:
    wired = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == object else {"float32": "FP32", "float64": "FP64", "int64": "INT64"}[
            str(array.dtype)]
        tensor = module.InferInput(name, list(array.shape), datatype)  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(array)
        wired.append(tensor)
    return wired


def test_add_sub(example: Callable[[str, str], Example]) -> None:
    served = example("add_sub.py", "AddSub")
    a = np.random.default_rng(0).random((3, 5), dtype=np.float32)
    b = np.ones((3, 5), np.float32)
    for module, client in ((httpclient, served.http), (grpcclient, served.grpc)):
        result = client.infer("AddSub", _inputs(module, INPUT_1=a, INPUT_2=b))
        np.testing.assert_allclose(result.as_numpy("add"), a + b)
        np.testing.assert_allclose(result.as_numpy("sub"), a - b)
    config = served.http.get_model_config("AddSub")
    assert config["max_batch_size"] == 128 and config["dynamic_batching"] is not None
    served.stop()


def test_identity_with_the_one_line_alias(example: Callable[[str, str], Example]) -> None:
    served = example("identity.py", "Identity")
    numbers = np.array([[1.5, -2.0], [3.25, 4.0]])
    text = np.array([[b"hello"], [b"\xe2\x82\xac"]], dtype=object)
    for module, client in ((httpclient, served.http), (grpcclient, served.grpc)):
        result = client.infer("Identity", _inputs(module, INPUT_1=numbers, INPUT_2=text))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT_1"), numbers)
        assert result.as_numpy("OUTPUT_2").tolist() == text.tolist()
    served.stop()


def test_sigterm_lets_the_request_in_flight_finish(example: Callable[[str, str], Example], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    started = tmp_path / "started"
    monkeypatch.setenv("SLOW_ECHO_STARTED", str(started))
    served = example("slow_echo.py", "SlowEcho")
    answers: list[object] = []
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.http_port}", network_timeout=30)
    call = threading.Thread(target=lambda: answers.append(
        client.infer("SlowEcho", _inputs(httpclient, value=np.array([[7]], dtype=np.int64))).as_numpy("echo")))
    call.start()
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started.exists(), "the request never reached the function"
    output = served.stop(signal.SIGTERM)  # the function is still sleeping
    call.join(30)
    client.close()
    assert not call.is_alive() and len(answers) == 1 and answers[0].tolist() == [[7]]  # type: ignore[attr-defined]
    assert "SIGTERM received" in output
    assert f"serving HTTP on 127.0.0.1:{served.http_port}" in output
    assert f"serving gRPC on 127.0.0.1:{served.grpc_port}" in output


def test_multi_instance(example: Callable[[str, str], Example]) -> None:
    served = example("multi_instance.py", "Scaler")
    features = np.arange(8, dtype=np.float32).reshape(2, 4)
    seen: list[int] = []

    def call(module: object, client: object) -> None:
        result = client.infer("Scaler", _inputs(module, features=features))  # type: ignore[attr-defined]
        np.testing.assert_allclose(result.as_numpy("scaled"), features * 2)
        seen.extend(int(value) for value in result.as_numpy("instance").ravel())

    threads = [threading.Thread(target=call, args=pair) for pair in served.clients() + served.clients()]
    for index, thread in enumerate(threads):
        if index == 2:  # past the batcher's 1 ms window: a second batch, which the busy instance 0 leaves to 1
            time.sleep(0.05)
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(seen) == 8 and set(seen) == {0, 1}  # both instances served
    assert served.http.get_model_config("Scaler")["instance_group"][0]["count"] == 2
    served.stop()


def test_streaming(example: Callable[[str, str], Example]) -> None:
    served = example("streaming.py", "Words")
    received: list[object] = []
    done = threading.Event()

    def collect(result: grpcclient.InferResult | None, error: Exception | None) -> None:
        received.append(error or result)
        response = result.get_response() if result is not None else None
        if error is not None or (response is not None and response.parameters["triton_final_response"].bool_param):
            done.set()

    served.grpc.start_stream(callback=collect)
    served.grpc.async_stream_infer("Words", _inputs(grpcclient, text=np.array([[b"one two three"]], dtype=object)),
                                   enable_empty_final_response=True)
    assert done.wait(30), "the stream did not end"
    served.grpc.stop_stream()
    words = [item.as_numpy("word")[0, 0] for item in received  # type: ignore[union-attr]
             if item.as_numpy("word") is not None]  # type: ignore[union-attr]
    assert words == [b"one", b"two", b"three"]
    # HTTP: the generate_stream extension (tritonclient's HTTP client has no streaming call)
    request = urllib.request.Request(f"http://127.0.0.1:{served.http_port}/v2/models/Words/generate_stream",
                                     data=json.dumps({"text": ["red green"]}).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        events = [json.loads(line[len(b"data: "):]) for line in response.read().splitlines() if line.startswith(b"data: ")]
    assert [event["word"] for event in events] == ["red", "green"]
    served.stop()


def test_dynamic_batching(example: Callable[[str, str], Example]) -> None:
    served = example("dynamic_batching.py", "Batched")
    results: list[tuple[int, int]] = []

    def call(module: object, client: object, value: int) -> None:
        result = client.infer("Batched", _inputs(module, value=np.array([[value]], np.int64)))  # type: ignore[attr-defined]
        results.append((int(result.as_numpy("doubled")[0, 0]), int(result.as_numpy("batch_size")[0, 0])))

    threads = [threading.Thread(target=call, args=(module, client, value)) for value, (module, client) in
               enumerate(served.clients() + served.clients())]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == [(0, 4), (2, 4), (4, 4), (6, 4)]  # one batch of four, from both protocols
    stats = served.http.get_inference_statistics("Batched")["model_stats"][0]
    assert stats["inference_count"] == 4 and stats["execution_count"] == 1
    served.stop()
