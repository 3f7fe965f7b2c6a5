"""Pytest plugin for triton-serve and its plugin authors: toy backends and an in-process server.

Installed through the ``pytest11`` entry point. Fixtures:

- ``tserve``: a factory; ``tserve(repo_path, **ServerOptions fields)`` starts a server on free
  ports in a background thread and returns a RunningServer (``.http_url``, ``.grpc_url``); it stops
  at teardown.
- ``toy_plugin``: the toy backends below, as a plugin object to pass in ``extra_plugins``.

Helpers: ``RunningServer`` (a server in a background thread, from ``ServerOptions``), ``free_port``,
``pretend_gpus``, ``apply_defaults`` (Triton's config defaults), ``PluginHost`` with ``PLUGINS_ENV`` and
``ENTRY_POINT_GROUP`` (which plugins load, and the entry-point group they register in), and
``EXAMPLE_REPOSITORY`` (the example model repository shipped in the package, which ``triton-serve``
serves when given no ``--model-repository``).
"""
from __future__ import annotations

import asyncio
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from ._engine import config_preparation as _config_preparation
from ._engine import repository as _repository
from ._engine.backend import Backend, InstanceSpec, Model, ModelInstance, ModelSpec
from ._engine.config import apply_defaults
from ._engine.errors import ServerError, Status
from ._engine.frontend.frontends import new_event_loop
from ._engine.hookspecs import hookimpl
from ._engine.inference import InferenceRequest, InferenceResponse, Tensor
from ._engine.pluginhost import ENTRY_POINT_GROUP, PLUGINS_ENV, PluginHost
from ._engine.protos.model_config_pb2 import ModelConfig
from ._engine.registry import BackendRegistry
from ._engine.examples import EXAMPLE_REPOSITORY
from ._engine.server import Server, ServerOptions

_PORTS_GIVEN: set[int] = set()


def _port_range() -> range:
    """The ports ``free_port`` hands out: below the kernel's ephemeral range, so that no client connection takes
    one between the handing out and the server's bind; under pytest-xdist, each worker a slice of its own."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    low, high = max(ephemeral_low - 12000, 10000), ephemeral_low
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and workers.isdigit():
        size = (high - low) // int(workers)
        low += int(worker[2:]) * size
        high = low + size
    return range(low, high)


def _listening_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing uses now, and never one this process was given before: servers bind their
    ports only later, so two calls in a row must not hand out the same port. Taken from ``_port_range``,
    from a random place in it (other test runs on the machine take theirs from the same range)."""
    ports = _port_range()
    if len(ports) < 100:  # an ephemeral range reaching down low: ask the kernel for one
        while True:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            if port not in _PORTS_GIVEN:
                _PORTS_GIVEN.add(port)
                return port
    start = random.randrange(len(ports))
    for offset in range(len(ports)):
        port = ports[(start + offset) % len(ports)]
        if port not in _PORTS_GIVEN and _listening_is_free(port):
            _PORTS_GIVEN.add(port)
            return port
    raise RuntimeError(f"no free port left in {ports.start}-{ports.stop - 1}")


# ---- toy backends ----------------------------------------------------------------------------

class _ToyModel(Model):
    backend: ToyBackend

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        if "fail_load" in self.spec.config.parameters:
            raise ServerError(f"toy model '{self.spec.name}' was told to fail loading")
        return _ToyInstance(self, instance)


class _ToyInstance(ModelInstance):
    model: _ToyModel

    async def load(self) -> None:
        if "crash_load" in self.model.spec.config.parameters:  # a bug, not a refusal
            raise RuntimeError(f"toy model '{self.model.spec.name}' crashed while loading")

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse] | None:
        spec = self.model.spec
        delay = float(spec.config.parameters["delay_s"].string_value or 0) \
            if "delay_s" in spec.config.parameters else 0.0
        if delay:
            await asyncio.sleep(delay)
        results = [self.model.backend.run(spec, request) for request in requests]
        return None if any(r is None for r in results) else results  # type: ignore[return-value]


def _identity(model: ModelSpec, request: InferenceRequest) -> InferenceResponse:
    """OUTPUTn = INPUTn (or each output named like its input with OUTPUT for INPUT)."""
    return InferenceResponse([Tensor(t.name.replace("INPUT", "OUTPUT"), t.datatype, t.shape, t.data)
                              for t in request.inputs.values()])


def _add_sub(model: ModelSpec, request: InferenceRequest) -> InferenceResponse:
    a, b = request.inputs["INPUT0"], request.inputs["INPUT1"]
    return InferenceResponse([Tensor("OUTPUT0", a.datatype, a.shape, a.data + b.data),
                              Tensor("OUTPUT1", a.datatype, a.shape, a.data - b.data)])


def _error(model: ModelSpec, request: InferenceRequest) -> InferenceResponse:
    raise ServerError(f"toy_error model '{model.name}' always fails", Status.INTERNAL)


def _crash(model: ModelSpec, request: InferenceRequest) -> InferenceResponse:
    raise RuntimeError(f"toy_crash model '{model.name}' always crashes")


_EXECUTIONS: dict[Path, int] = {}


def _count(model: ModelSpec, request: InferenceRequest) -> InferenceResponse:
    """OUTPUT0 = how many requests this model directory has executed (shows whether a cache answered)."""
    count = _EXECUTIONS[model.version_dir] = _EXECUTIONS.get(model.version_dir, 0) + 1
    return InferenceResponse([Tensor("OUTPUT0", "INT64", (1,), np.array([count], np.int64))])


def _repeat(model: ModelSpec, request: InferenceRequest) -> None:
    """Decoupled: one response per element of INPUT0 (INT32 count), then the final flag."""
    count = int(request.inputs["INPUT0"].data.ravel()[0])
    for i in range(count):
        request.send(InferenceResponse([Tensor("OUTPUT0", "INT32", (1,), np.array([i], dtype=np.int32))]),
                     final=False)
    request.send(None, final=True)


class ToyBackend(Backend):
    """A toy backend; its auto-complete merges the model file (ModelConfig text) into unset fields."""

    run: Callable[[ModelSpec, InferenceRequest], InferenceResponse | None]

    def auto_complete_config(self, model: ModelSpec) -> None:
        if not model.model_file.is_file():
            return
        found = text_format.Parse(model.model_file.read_text(), ModelConfig())
        if not model.config.input:
            model.config.input.extend(found.input)
        if not model.config.output:
            model.config.output.extend(found.output)
        if model.config.max_batch_size == 0:
            model.config.max_batch_size = found.max_batch_size

    def create_model(self, spec: ModelSpec) -> Model:
        return _ToyModel(self, spec)


def _toy(name: str, run: Callable[..., Any], platforms: tuple[str, ...] = ()) -> type[Backend]:
    return type(f"Toy_{name}", (ToyBackend,), {"name": name, "run": staticmethod(run), "platforms": platforms,
                                                "default_model_filename": f"{name}.toy"})


TOY_BACKENDS = (_toy("toy_identity", _identity, ("toy_identity_platform",)), _toy("toy_add_sub", _add_sub),
                _toy("toy_error", _error), _toy("toy_crash", _crash), _toy("toy_repeat", _repeat),
                _toy("toy_count", _count))


class _ProbeModel(Model):
    """One version of a ``toy_probe`` model: what its instances have done, executions so far and how
    many ran at once."""

    def __init__(self, backend: Backend, spec: ModelSpec) -> None:
        super().__init__(backend, spec)
        self.executions = 0
        self.running = 0
        self.peak = 0

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return _ProbeInstance(self, instance)


class _ProbeInstance(ModelInstance):
    model: _ProbeModel

    async def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse]:
        counters = self.model
        counters.executions += 1
        execution = counters.executions
        counters.running += 1
        counters.peak = max(counters.peak, counters.running)
        try:
            delay = max(float(r.inputs["INPUT0"].data.max()) for r in requests)
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            counters.running -= 1
        total = sum(r.inputs["INPUT0"].shape[0] for r in requests)
        responses = []
        for request in requests:
            data = request.inputs["INPUT0"].data
            rows = data.shape[0]
            responses.append(InferenceResponse([Tensor("OUTPUT0", "FP32", data.shape, data)] + [
                Tensor(name, "INT64", (rows, 1), np.full((rows, 1), value, np.int64))
                for name, value in (("EXECUTION", execution), ("BATCH", total), ("PEAK", counters.peak))]))
        return responses


class ProbeBackend(Backend):
    """Backend ``toy_probe``: each execution sleeps for its largest INPUT0 value (FP32 seconds, batch
    dimension first), then answers every row with OUTPUT0 = INPUT0, EXECUTION (the execution's
    number, 1, 2... per loaded model version), BATCH (the execution's total batch size) and PEAK (the
    most executions of the model version seen running at once so far). For testing schedulers."""

    name = "toy_probe"

    def create_model(self, spec: ModelSpec) -> Model:
        return _ProbeModel(self, spec)


PROBE_CONFIG = """
backend: "toy_probe"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: {ragged} }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "EXECUTION" data_type: TYPE_INT64 dims: [ 1 ] }},
         {{ name: "BATCH" data_type: TYPE_INT64 dims: [ 1 ] }},
         {{ name: "PEAK" data_type: TYPE_INT64 dims: [ 1 ] }} ]
"""


def probe_config(max_batch_size: int = 8, ragged: bool = False) -> str:
    """A config.pbtxt for the ``toy_probe`` backend; append scheduling and instance groups to it."""
    return PROBE_CONFIG.format(max_batch_size=max_batch_size, ragged=str(ragged).lower())


class ToyBackendsPlugin:
    """Registers the toy backends: toy_identity, toy_add_sub, toy_error (raises ServerError), toy_crash
    (raises RuntimeError), toy_repeat (decoupled), toy_count, toy_probe. A toy model with the config
    parameter ``fail_load`` refuses to load (ServerError); with ``crash_load`` it raises RuntimeError."""

    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        """Register the toy backends and ``ProbeBackend``."""
        for backend in (*TOY_BACKENDS, ProbeBackend):
            registry.add(backend)


# ---- an in-process server ----------------------------------------------------------------------

class RunningServer:
    """A Server on its own event loop in a background thread."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="triton-serve", daemon=True)
        self.thread.start()
        self.server: Server = self.call(self._create)
        self.call(self.server.start)
        self._wait_listening(options.http_port if options.allow_http else None)

    async def _create(self) -> Server:
        return Server(self.options)

    def call(self, make_coro: Callable[[], Any], timeout: float = 120) -> Any:
        """Run a coroutine on the server's loop and return its result."""
        future: Future[Any] = asyncio.run_coroutine_threadsafe(make_coro(), self.loop)
        return future.result(timeout)

    def _wait_listening(self, port: int | None) -> None:
        if port is None:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError(f"triton-serve did not listen on port {port}")

    @staticmethod
    async def _cancel_leftover_tasks() -> None:
        """Finish tasks the HTTP library leaves pending at shutdown (its lifespan task), so that
        closing the loop does not destroy them mid-flight."""
        current = asyncio.current_task()
        leftover = [task for task in asyncio.all_tasks() if task is not current]
        for task in leftover:
            task.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)

    @property
    def http_url(self) -> str:
        """``127.0.0.1:<port>`` of the HTTP front-end, as tritonclient takes it."""
        return f"127.0.0.1:{self.options.http_port}"

    @property
    def grpc_url(self) -> str:
        """``127.0.0.1:<port>`` of the gRPC front-end."""
        return f"127.0.0.1:{self.options.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint, ``http://127.0.0.1:<metrics port>/metrics``."""
        return f"http://127.0.0.1:{self.options.metrics_port}/metrics"

    def stop(self) -> None:
        """Stop the server and its loop; calling it again does nothing."""
        if self.loop.is_closed():
            return
        try:
            self.call(self.server.stop)
            self.call(self._cancel_leftover_tasks)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


def pretend_gpus(monkeypatch: pytest.MonkeyPatch, ids: Sequence[int]) -> None:
    """Make model loading see these GPU ids, to test KIND_GPU handling on a machine without a GPU."""
    for module in (_config_preparation, _repository):  # KIND_AUTO's choice, and the GPUs of KIND_GPU groups
        monkeypatch.setattr(module, "visible_gpu_ids", lambda: list(ids))


def wire_samples() -> list[tuple[str, str, np.ndarray]]:
    """(name, datatype, array) tensors that every process boundary must carry unchanged: each datatype (BF16 as
    its uint16 bit patterns), BYTES with empty, non-UTF-8 and long elements, zero-sized and 0-d shapes, and
    one large tensor (4 MiB)."""
    rng = np.random.default_rng(7)
    numeric = [("BOOL", np.array([[True, False, True]])), ("UINT8", np.arange(6, dtype=np.uint8)),
               ("UINT16", np.array([0, 65535], np.uint16)), ("UINT32", np.array([2**32 - 1], np.uint32)),
               ("UINT64", np.array([2**64 - 1, 0], np.uint64)), ("INT8", np.array([-128, 127], np.int8)),
               ("INT16", np.array([-2**15], np.int16)), ("INT32", np.arange(-3, 3, dtype=np.int32).reshape(2, 3)),
               ("INT64", np.array([-2**63, 2**63 - 1], np.int64)), ("FP16", np.array([0.5, -np.inf], np.float16)),
               ("FP32", np.array([[1.5, np.nan], [-0.0, 3e38]], np.float32)),
               ("FP64", np.array([np.pi, -1e-300], np.float64)),
               ("BF16", np.array([0x3F80, 0xC000, 0x7FC0], np.uint16))]  # 1.0, -2.0, NaN
    samples = [(f"{datatype.lower()}_in", datatype, array) for datatype, array in numeric]
    words = np.array([b"", "\u00e9t\u00e9".encode(), b"\xff\x00\xfe", b"x" * 70_000], dtype=object).reshape(2, 2)
    samples += [("bytes_in", "BYTES", words), ("bytes_empty", "BYTES", np.empty((0, 2), dtype=object)),
                ("fp32_empty", "FP32", np.zeros((3, 0), np.float32)), ("int32_scalar", "INT32", np.array(5, np.int32)),
                ("fp32_large", "FP32", rng.standard_normal(1 << 20).astype(np.float32))]
    return samples


def assert_same_tensor(array: np.ndarray, expected: np.ndarray, datatype: str) -> None:
    """``array`` holds what ``expected`` held, element for element (NaN equal to NaN), in ``expected``'s shape."""
    assert array.shape == expected.shape, (datatype, array.shape, expected.shape)
    if datatype == "BYTES":
        assert [bytes(item) for item in array.ravel()] == list(expected.ravel()), datatype
    else:
        np.testing.assert_array_equal(array, expected, err_msg=datatype)


__all__ = ["ENTRY_POINT_GROUP", "EXAMPLE_REPOSITORY", "PLUGINS_ENV", "PluginHost", "RunningServer", "ServerOptions",
           "TOY_BACKENDS", "ToyBackend", "ToyBackendsPlugin", "apply_defaults", "free_port", "pretend_gpus",
           "probe_config", "toy_plugin", "tserve", "wire_samples", "assert_same_tensor"]


@pytest.fixture
def toy_plugin() -> ToyBackendsPlugin:
    return ToyBackendsPlugin()


@pytest.fixture
def tserve() -> Iterator[Callable[..., RunningServer]]:
    started: list[RunningServer] = []

    def start(*repositories: str | Path, **options: Any) -> RunningServer:
        options.setdefault("http_port", free_port())
        options.setdefault("grpc_port", free_port())
        options.setdefault("metrics_port", free_port())
        for key in ("http_address", "grpc_address", "metrics_address"):
            options.setdefault(key, "127.0.0.1")
        running = RunningServer(ServerOptions(model_repositories=[str(r) for r in repositories], **options))
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()
