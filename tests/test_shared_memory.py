"""Triton's system and CUDA shared-memory extensions through tritonclient's HTTP and gRPC clients and
its shared-memory utilities: registration, tensors read from and written into regions, bad input."""
from __future__ import annotations

import base64
import contextlib
import gc
import itertools
import mmap
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from triton_serve._engine.backend import Backend, InstanceSpec, Model, ModelInstance, ModelSpec
from triton_serve._engine.errors import Status
from triton_serve._engine.frontend.grpc.status import GRPC_CODE
from triton_serve._engine.hookspecs import hookimpl
from triton_serve._engine.inference import InferenceRequest, InferenceResponse, Tensor
from triton_serve._engine.registry import BackendRegistry
from triton_serve.testing import EXAMPLE_REPOSITORY, free_port

from .conftest import ADD_SUB, FRONTEND_MODES

PROTOCOLS = ["http", "grpc"]
IDENTITY_BYTES = """
backend: "toy_identity"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] }
output { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] }
"""
SLOW_ADD_SUB = ADD_SUB + 'parameters { key: "delay_s" value { string_value: "1.5" } }'
TENSOR_BYTES = 64  # one [1, 16] INT32 tensor of add_sub
_KEYS = itertools.count()


@pytest.fixture(params=FRONTEND_MODES, ids=lambda count: f"frontend_processes={count}")
def frontend_processes(request: pytest.FixtureRequest) -> int:
    """Every test here runs with in-process front-ends and with two front-end processes."""
    return int(request.param)


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def server(add_model: Callable[..., Path], toy_server: Callable[..., Any]) -> Any:
    add_model("add_sub", ADD_SUB)
    add_model("slow_add_sub", SLOW_ADD_SUB)  # long enough for two unregister calls while it runs
    add_model("identity_bytes", IDENTITY_BYTES)
    return toy_server()


@dataclass
class Segment:
    """A POSIX shared-memory object the test created with tritonclient's utilities."""

    handle: Any
    key: str
    byte_size: int

    def set(self, arrays: list[np.ndarray], offset: int = 0) -> None:
        shm.set_shared_memory_region(self.handle, arrays, offset)

    def get(self, datatype: Any, shape: Sequence[int], offset: int = 0) -> np.ndarray:
        return shm.get_contents_as_numpy(self.handle, datatype, shape, offset)


@pytest.fixture
def segment() -> Iterator[Callable[[int], Segment]]:
    made: list[Segment] = []

    def make(byte_size: int) -> Segment:
        key = f"/tserve_test_{os.getpid()}_{next(_KEYS)}"
        made.append(Segment(shm.create_shared_memory_region(key[1:], key, byte_size), key, byte_size))
        return made[-1]

    yield make
    for each in made:
        with contextlib.suppress(Exception):  # a test may have deleted it already
            shm.destroy_shared_memory_region(each.handle)


class Api:
    """The same calls through tritonclient's HTTP or gRPC client, and their errors in one shape."""

    def __init__(self, protocol: str, server: Any) -> None:
        self.protocol = protocol
        self.module: Any = httpclient if protocol == "http" else grpcclient
        self.url = server.http_url if protocol == "http" else server.grpc_url
        self.client = self.module.InferenceServerClient(self.url)
        self.registry = server.server.dataplane.shared_memory  # the model owner's (it runs in this process)

    def register(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        self.client.register_system_shared_memory(name, key, byte_size, offset=offset)

    def status(self, name: str = "") -> dict[str, tuple[str, int, int]]:
        """name -> (key, offset, byte_size)."""
        if self.protocol == "http":
            entries = self.client.get_system_shared_memory_status(name)
        else:
            entries = self.client.get_system_shared_memory_status(name, as_json=True).get("regions", {}).values()
        return {e["name"]: (e["key"], int(e.get("offset", 0)), int(e["byte_size"])) for e in entries}

    def unregister(self, name: str = "") -> None:
        self.client.unregister_system_shared_memory(name)

    def shm_input(self, name: str, region: str, byte_size: int = TENSOR_BYTES, offset: int = 0,
                  shape: Sequence[int] = (1, 16), datatype: str = "INT32") -> Any:
        tensor = self.module.InferInput(name, list(shape), datatype)
        tensor.set_shared_memory(region, byte_size, offset=offset)
        return tensor

    def data_input(self, name: str, array: np.ndarray, datatype: str = "INT32") -> Any:
        tensor = self.module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        return tensor

    def shm_output(self, name: str, region: str, byte_size: int = TENSOR_BYTES, offset: int = 0) -> Any:
        output = self.module.InferRequestedOutput(name)
        output.set_shared_memory(region, byte_size, offset=offset)
        return output

    def output(self, name: str) -> Any:
        return self.module.InferRequestedOutput(name)

    def fails(self, status: Status, message: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """``call`` fails with Triton's ``status`` (as this protocol spells it) and a message containing ``message``."""
        with pytest.raises(InferenceServerException) as raised:
            call(*args, **kwargs)
        expected = str(status.http_status) if self.protocol == "http" else str(GRPC_CODE[status])
        assert raised.value.status() == expected, raised.value.message()
        assert message in raised.value.message()

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def api(server: Any, protocol: str) -> Iterator[Api]:
    api = Api(protocol, server)
    yield api
    api.close()


def add_sub_inputs(segment: Segment) -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    segment.set([a, b])
    return a, b


# ---- registration ---------------------------------------------------------------------------------

def test_register_status_and_unregister(api: Api, segment: Callable[[int], Segment]) -> None:
    first, second = segment(256), segment(4096)
    assert api.status() == {}
    api.register("first", first.key, 128)
    api.register("second", second.key, 1000, offset=100)  # an offset that is not page aligned works too
    assert api.status() == {"first": (first.key, 0, 128), "second": (second.key, 100, 1000)}
    assert api.status("second") == {"second": (second.key, 100, 1000)}
    api.unregister("first")
    assert api.status() == {"second": (second.key, 100, 1000)}
    api.register("first", first.key, 256)
    api.unregister()
    assert api.status() == {}


# ---- tensors in shared memory -----------------------------------------------------------------------

def test_inputs_and_outputs_in_shared_memory(api: Api, segment: Callable[[int], Segment]) -> None:
    inputs, outputs = segment(2 * TENSOR_BYTES), segment(2 * TENSOR_BYTES)
    a, b = add_sub_inputs(inputs)
    api.register("inputs", inputs.key, 2 * TENSOR_BYTES)
    api.register("outputs", outputs.key, 2 * TENSOR_BYTES)
    result = api.client.infer("add_sub", [api.shm_input("INPUT0", "inputs"),
                                          api.shm_input("INPUT1", "inputs", offset=TENSOR_BYTES)],
                              outputs=[api.shm_output("OUTPUT0", "outputs"),
                                       api.shm_output("OUTPUT1", "outputs", offset=TENSOR_BYTES)])
    assert outputs.get(np.int32, [1, 16]).tolist() == (a + b).tolist()
    assert outputs.get(np.int32, [1, 16], offset=TENSOR_BYTES).tolist() == (a - b).tolist()
    if api.protocol == "http":  # as Triton: the outputs carry no data, and no parameters
        assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
    else:  # one empty raw_output_contents entry per output in shared memory
        assert list(result.get_response().raw_output_contents) == [b"", b""]


def test_shared_memory_and_regular_tensors_in_one_request(api: Api, segment: Callable[[int], Segment]) -> None:
    region = segment(2 * TENSOR_BYTES)
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 7, dtype=np.int32)
    region.set([a])
    api.register("r", region.key, 2 * TENSOR_BYTES)
    result = api.client.infer("add_sub", [api.shm_input("INPUT0", "r"), api.data_input("INPUT1", b)],
                              outputs=[api.output("OUTPUT0"), api.shm_output("OUTPUT1", "r", offset=TENSOR_BYTES)])
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert region.get(np.int32, [1, 16], offset=TENSOR_BYTES).tolist() == (a - b).tolist()
    assert region.get(np.int32, [1, 16]).tolist() == a.tolist()  # inputs are only read


def test_bytes_tensors_in_shared_memory(api: Api, segment: Callable[[int], Segment]) -> None:
    strings = np.array([b"hello", b"", "\u00fcn\u00ef".encode(), b"\x00\xff"], dtype=np.object_)
    serialized = serialize_byte_tensor(strings)  # a 0-d object array holding the wire bytes
    size = len(serialized.item())
    inputs, outputs = segment(size), segment(size + 16)
    inputs.set([serialized])
    api.register("in", inputs.key, size)
    api.register("out", outputs.key, size + 16)
    api.client.infer("identity_bytes", [api.shm_input("INPUT0", "in", size, shape=[4], datatype="BYTES")],
                     outputs=[api.shm_output("OUTPUT0", "out", size + 16)])
    assert outputs.get(np.object_, [4]).tolist() == strings.tolist()


class _ViewProbe(ModelInstance):
    """OUTPUT0 = [1, 1] when INPUT0 is a read-only array over a memory map (a region, not a copy)."""

    async def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse]:
        responses = []
        for request in requests:
            data = request.inputs["INPUT0"].data
            base: Any = data
            while isinstance(base, np.ndarray):
                base = base.base
            viewed = isinstance(getattr(base, "obj", None), mmap.mmap) and not data.flags.writeable
            answer = np.array([[int(viewed)]], np.int32)
            responses.append(InferenceResponse([Tensor("OUTPUT0", "INT32", (1, 1), answer)]))
        return responses


class _ViewProbeModel(Model):
    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return _ViewProbe(self, instance)


class _ViewProbeBackend(Backend):
    name = "toy_view_probe"

    def create_model(self, spec: ModelSpec) -> Model:
        return _ViewProbeModel(self, spec)


class _ViewProbePlugin:
    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(_ViewProbeBackend)


def test_inputs_reach_an_in_process_backend_without_a_copy(add_model: Callable[..., Path], tserve: Callable[..., Any],
                                                           repo: Path, toy_plugin: Any, frontend_processes: int,
                                                           segment: Callable[[int], Segment]) -> None:
    add_model("probe", 'backend: "toy_view_probe"\nmax_batch_size: 8\n'
                       'input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }\n'
                       'output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }\n')
    server = tserve(repo, extra_plugins=[("toy", toy_plugin), ("view_probe", _ViewProbePlugin())],
                    frontend_processes=frontend_processes)
    region = segment(TENSOR_BYTES)
    for protocol in PROTOCOLS:
        api = Api(protocol, server)
        api.register(protocol, region.key, TENSOR_BYTES)
        assert api.client.infer("probe", [api.shm_input("INPUT0", protocol)]).as_numpy("OUTPUT0").tolist() == [[1]]
        assert api.client.infer("probe", [api.data_input("INPUT0", np.zeros((1, 16), np.int32))]) \
            .as_numpy("OUTPUT0").tolist() == [[0]]
        api.close()


def test_response_cache_with_shared_memory(add_model: Callable[..., Path], toy_server: Callable[..., Any],
                                           segment: Callable[[int], Segment]) -> None:
    """A cache hit is written into the output region, and the cache keeps no view of the client's memory."""
    add_model("identity", 'backend: "toy_identity"\nmax_batch_size: 0\nresponse_cache { enable: true }\n'
                          'input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }\n'
                          'output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }\n')
    server = toy_server(cache_config=("local", {"size": "1048576"}))
    api = Api("grpc", server)
    inputs, outputs = segment(TENSOR_BYTES), segment(TENSOR_BYTES)
    first = np.arange(16, dtype=np.int32)
    inputs.set([first])
    api.register("in", inputs.key, TENSOR_BYTES)
    api.register("out", outputs.key, TENSOR_BYTES)
    for _ in range(2):  # a miss, then a hit
        outputs.set([np.zeros(16, np.int32)])
        api.client.infer("identity", [api.shm_input("INPUT0", "in", shape=[16])],
                         outputs=[api.shm_output("OUTPUT0", "out")])
        assert outputs.get(np.int32, [16]).tolist() == first.tolist()
    inputs.set([np.full(16, -1, np.int32)])  # the client reuses its input region
    outputs.set([np.zeros(16, np.int32)])
    api.client.infer("identity", [api.data_input("INPUT0", first)],  # the same key as before: a hit
                     outputs=[api.shm_output("OUTPUT0", "out")])
    assert outputs.get(np.int32, [16]).tolist() == first.tolist()
    stats = api.client.get_inference_statistics("identity", as_json=True)["model_stats"][0]["inference_stats"]
    assert (int(stats["cache_hit"]["count"]), int(stats["cache_miss"]["count"])) == (2, 1)
    api.close()


def test_stream_outputs_into_shared_memory(server: Any, segment: Callable[[int], Segment]) -> None:
    region = segment(3 * TENSOR_BYTES)
    a, b = add_sub_inputs(region)
    api = Api("grpc", server)
    api.register("r", region.key, 3 * TENSOR_BYTES)
    results: list[Any] = []
    api.client.start_stream(callback=lambda result, error: results.append(error or result))
    api.client.async_stream_infer("add_sub", [api.shm_input("INPUT0", "r"), api.shm_input("INPUT1", "r", offset=64)],
                                  outputs=[api.shm_output("OUTPUT0", "r", offset=2 * TENSOR_BYTES)])
    api.client.stop_stream()
    assert len(results) == 1 and list(results[0].get_response().raw_output_contents) == [b""]
    assert region.get(np.int32, [1, 16], offset=2 * TENSOR_BYTES).tolist() == (a + b).tolist()
    api.close()


# ---- bad input: Triton's status and message, and the registry unchanged --------------------------------

def test_bad_registrations(api: Api, segment: Callable[[int], Segment]) -> None:
    small = segment(256)
    link = f"/dev/shm/tserve_test_link_{os.getpid()}_{next(_KEYS)}"
    missing = f"/tserve_test_missing_{os.getpid()}"
    cases: list[tuple[Status, str, Callable[[], Any]]] = [
        (Status.ALREADY_EXISTS, "shared memory region 'taken' already in manager",
         lambda: api.register("taken", small.key, 64)),
        (Status.INTERNAL, f"Unable to open shared memory region: '{missing}'", lambda: api.register("x", missing, 64)),
        (Status.INTERNAL, "Unable to open shared memory region: '/etc/passwd'",
         lambda: api.register("x", "/etc/passwd", 64)),
        (Status.INTERNAL, "Unable to open shared memory region: '../x'", lambda: api.register("x", "../x", 64)),
        (Status.INTERNAL, "Unable to open shared memory region: '/a\0b' (registering 'x': not a shared memory key)",
         lambda: api.register("x", "/a\0b", 64)),
        (Status.INTERNAL, f"Unable to open shared memory region: '/{Path(link).name}'",
         lambda: api.register("x", "/" + Path(link).name, 64)),  # a link out of /dev/shm is not followed
        (Status.INVALID_ARG, "failed to register shared memory region 'x': invalid args",
         lambda: api.register("x", small.key, 257)),
        (Status.INVALID_ARG, "failed to register shared memory region 'x': invalid args",
         lambda: api.register("x", small.key, 64, offset=200)),
        (Status.INVALID_ARG, "failed to register shared memory region 'x': invalid args",
         lambda: api.register("x", small.key, 16, offset=2**64 - 8)),  # offset + byte_size overflows 64 bits
        (Status.INVALID_ARG, "failed to register shared memory region 'x': invalid args",
         lambda: api.register("x", small.key, 0)),
    ]
    os.symlink("/etc/passwd", link)
    try:
        api.register("taken", small.key, 64)
        for status, message, call in cases:
            api.fails(status, message, call)
            assert api.status() == {"taken": (small.key, 0, 64)}
    finally:
        os.unlink(link)


def test_bad_registration_bodies_over_http(server: Any, segment: Callable[[int], Segment]) -> None:
    key = segment(256).key
    url = f"http://{server.http_url}/v2/systemsharedmemory"
    cases = [
        ({"key": key, "offset": -1, "byte_size": 8}, 500, "Unable to parse 'offset' of shared memory region 'x'"),
        ({"key": key, "offset": "1", "byte_size": 8}, 500, "Unable to parse 'offset' of shared memory region 'x'"),
        ({"key": key, "byte_size": 8.5}, 500, "Unable to parse 'byte_size' of shared memory region 'x'"),
        ({"key": key, "byte_size": True}, 500, "Unable to parse 'byte_size' of shared memory region 'x'"),
        ({"key": key, "offset": 2**64, "byte_size": 8}, 500, "Unable to parse 'offset' of shared memory region 'x'"),
        ({"key": 5, "byte_size": 8}, 500, "Unable to parse 'key' of shared memory region 'x'"),
        ({"byte_size": 8}, 400, "Shared memory register request has no 'key' field"),
        ({"key": key}, 400, "Shared memory register request has no 'byte_size' field"),
    ]
    for body, status, message in cases:
        response = httpx.post(f"{url}/region/x/register", json=body)
        assert response.status_code == status, response.text
        assert message in response.json()["error"]
        assert httpx.get(f"{url}/status").json() == []
    response = httpx.post(f"{url}/register", json={"key": key, "byte_size": 8})
    assert response.status_code == 400
    assert response.json()["error"] == "'region name' is necessary to register system shared memory region"
    assert httpx.get(f"{url}/region/x/register").status_code == 405
    assert httpx.post(f"{url}/status").status_code == 405
    assert httpx.get(f"{url}/status").json() == []


def test_status_and_unregister_of_unknown_regions(api: Api, segment: Callable[[int], Segment]) -> None:
    region = segment(256)
    api.register("r", region.key, 256)
    api.fails(Status.NOT_FOUND, "Unable to find system shared memory region: 'nope'", api.status, "nope")
    api.fails(Status.NOT_FOUND, "The region named 'r' is registered as system shared memory, not CUDA shared memory",
              api.client.get_cuda_shared_memory_status, "r")
    api.unregister("nope")  # as in Triton: unregistering an unknown region, or one twice, is no error
    api.client.unregister_cuda_shared_memory("r")  # nor a system region through the CUDA call
    assert api.status() == {"r": (region.key, 0, 256)}
    api.unregister("r")
    api.unregister("r")
    assert api.status() == {}
    if api.protocol == "grpc":
        api.fails(Status.INVALID_ARG, "'region name' is necessary to register system shared memory region",
                  api.register, "", region.key, 64)


def test_bad_inference_requests(api: Api, segment: Callable[[int], Segment]) -> None:
    region = segment(2 * TENSOR_BYTES)
    add_sub_inputs(region)
    api.register("r", region.key, 2 * TENSOR_BYTES)
    good = api.shm_input("INPUT1", "r", offset=TENSOR_BYTES)
    negative = "Unable to parse 'shared_memory_offset'" if api.protocol == "http" else \
        "Invalid offset for shared memory region: 'r'"
    cases: list[tuple[Status, str, list[Any], list[Any]]] = [
        (Status.NOT_FOUND, "Unable to find shared memory region: 'nope'", [api.shm_input("INPUT0", "nope")], []),
        (Status.INVALID_ARG, "input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 64, got 32",
         [api.shm_input("INPUT0", "r", byte_size=32)], []),
        (Status.INVALID_ARG, "Invalid offset for shared memory region: 'r'",
         [api.shm_input("INPUT0", "r", offset=2 * TENSOR_BYTES)], []),
        (Status.INVALID_ARG, "Invalid offset + byte size for shared memory region: 'r'",
         [api.shm_input("INPUT0", "r", offset=TENSOR_BYTES + 8)], []),
        (Status.INVALID_ARG, "Invalid offset + byte size for shared memory region: 'r'",
         [api.shm_input("INPUT0", "r", byte_size=2**63 - 1, offset=8)], []),
        (Status.INTERNAL if api.protocol == "http" else Status.INVALID_ARG, negative,
         [api.shm_input("INPUT0", "r", offset=-8)], []),
        (Status.NOT_FOUND, "Unable to find shared memory region: 'nope'",
         [api.shm_input("INPUT0", "r")], [api.shm_output("OUTPUT0", "nope")]),
        (Status.INTERNAL, "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be "
         "at least 64 bytes to hold the results", [api.shm_input("INPUT0", "r")], [api.shm_output("OUTPUT0", "r", 32)]),
    ]
    for status, message, inputs, outputs in cases:
        api.fails(status, message, api.client.infer, "add_sub", inputs + [good], outputs=outputs or None)
        assert api.status() == {"r": (region.key, 0, 2 * TENSOR_BYTES)}
        assert api.registry.get("r").users == 0  # a failed request holds no region
    assert api.client.infer("add_sub", [api.shm_input("INPUT0", "r"), good]).as_numpy("OUTPUT1").tolist() == \
        [[i - 3 for i in range(16)]]


def test_output_in_shared_memory_excludes_binary_data_and_classification(server: Any) -> None:
    inputs = [{"name": f"INPUT{i}", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16} for i in (0, 1)]
    for other, value in (("binary_data", True), ("classification", 2)):
        body = {"inputs": inputs, "outputs": [{"name": "OUTPUT0", "parameters": {
            "shared_memory_region": "r", "shared_memory_byte_size": 64, other: value}}]}
        response = httpx.post(f"http://{server.http_url}/v2/models/add_sub/infer", json=body)
        assert (response.status_code, response.json()) == \
            (400, {"error": f"Output can't set both 'shared_memory_region' and '{other}'"})


# ---- lifecycle and safety ---------------------------------------------------------------------------

def test_deleted_or_shrunk_segment_gets_errors_not_a_crash(api: Api, segment: Callable[[int], Segment]) -> None:
    deleted, shrunk = segment(2 * TENSOR_BYTES), segment(2 * TENSOR_BYTES)
    for each in (deleted, shrunk):
        add_sub_inputs(each)
        api.register(each.key[1:], each.key, 2 * TENSOR_BYTES)
    shm.destroy_shared_memory_region(deleted.handle)  # the client unlinks it while registered
    with open(f"/dev/shm{shrunk.key}", "r+b") as handle:
        os.ftruncate(handle.fileno(), 8)  # touching the mapping past 8 bytes now would raise SIGBUS
    for each, what in ((deleted, "was deleted while registered"), (shrunk, "shrank to 8 bytes")):
        name = each.key[1:]
        inputs = [api.shm_input("INPUT0", name), api.shm_input("INPUT1", name, offset=TENSOR_BYTES)]
        api.fails(Status.INVALID_ARG, f"shared memory region '{name}' is unusable", api.client.infer, "add_sub", inputs)
        api.fails(Status.INVALID_ARG, what, api.client.infer, "add_sub",
                  [api.data_input("INPUT0", np.ones((1, 16), np.int32)),
                   api.data_input("INPUT1", np.ones((1, 16), np.int32))], outputs=[api.shm_output("OUTPUT0", name)])
        api.unregister(name)
    ones = np.ones((1, 16), np.int32)
    result = api.client.infer("add_sub", [api.data_input("INPUT0", ones), api.data_input("INPUT1", ones)])
    assert result.as_numpy("OUTPUT0").tolist() == [[2] * 16]  # the server still serves


def test_unregistering_a_region_in_use_fails_and_its_request_completes(api: Api,
                                                                      segment: Callable[[int], Segment]) -> None:
    """As in Triton 2.51: the unregister that comes while a request reads the region gets an error (the
    region stays mapped under the request), a request that comes after the unregister gets one."""
    region, spare = segment(2 * TENSOR_BYTES), segment(TENSOR_BYTES)
    a, b = add_sub_inputs(region)
    api.register("r", region.key, 2 * TENSOR_BYTES)
    api.register("spare", spare.key, TENSOR_BYTES)
    results: list[Any] = []
    inputs = [api.shm_input("INPUT0", "r"), api.shm_input("INPUT1", "r", offset=TENSOR_BYTES)]
    outputs = [api.shm_output("OUTPUT0", "r")]

    def infer() -> None:
        client = api.module.InferenceServerClient(api.url)
        results.append(client.infer("slow_add_sub", inputs, outputs=outputs))
        client.close()

    request = threading.Thread(target=infer)
    request.start()
    deadline = time.monotonic() + 30
    while api.registry.get("r").users == 0:  # the request has reached the model owner
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.01)
    api.fails(Status.INTERNAL, "Cannot unregister shared memory region 'r', it is currently in use.", api.unregister, "r")
    api.fails(Status.INTERNAL, "Failed to unregister the following system shared memory regions: r ,", api.unregister)
    assert api.status() == {"r": (region.key, 0, 2 * TENSOR_BYTES)}  # the free region went, the busy one stays
    request.join(30)
    assert not request.is_alive() and results, "the request failed"
    assert region.get(np.int32, [1, 16]).tolist() == (a + b).tolist()
    api.unregister("r")
    assert api.status() == {}
    api.fails(Status.NOT_FOUND, "Unable to find shared memory region: 'r'", api.client.infer, "add_sub", inputs)


def test_registering_without_a_region_name(api: Api, segment: Callable[[int], Segment]) -> None:
    """gRPC: Triton's messages for the other arguments first (Triton's own tests register ("", "", 0)); a
    valid region is then refused rather than registered as ''. HTTP: the route needs a name (Triton's too)."""
    region = segment(TENSOR_BYTES)
    if api.protocol == "grpc":
        api.fails(Status.INTERNAL, "Unable to open shared memory region: ''", api.register, "", "", 0)
        api.fails(Status.INVALID_ARG, "failed to register shared memory region '': invalid args",
                  api.client.register_cuda_shared_memory, "", b"", 0, 0)
        api.fails(Status.INVALID_ARG, "'region name' is necessary to register system shared memory region",
                  api.register, "", region.key, TENSOR_BYTES)
    else:
        api.fails(Status.NOT_FOUND, "Not Found", api.register, "", "", 0)
        api.fails(Status.NOT_FOUND, "Not Found", api.client.register_cuda_shared_memory, "", b"", 0, 0)
    assert api.status() == {}
    status = api.client.get_cuda_shared_memory_status()
    assert (status == []) if api.protocol == "http" else not status.regions


def test_shutdown_unmaps_every_region(add_model: Callable[..., Path], toy_server: Callable[..., Any],
                                      segment: Callable[[int], Segment]) -> None:
    add_model("add_sub", ADD_SUB)
    server = toy_server()
    region = segment(2 * TENSOR_BYTES)
    add_sub_inputs(region)
    api = Api("http", server)
    api.register("r", region.key, 2 * TENSOR_BYTES)
    api.client.infer("add_sub", [api.shm_input("INPUT0", "r"), api.shm_input("INPUT1", "r", offset=TENSOR_BYTES)])
    api.close()
    shm.destroy_shared_memory_region(region.handle)  # now only the server maps it
    maps = Path("/proc/self/maps")
    assert region.key in maps.read_text()
    server.stop()
    gc.collect()
    assert region.key not in maps.read_text()


# ---- CUDA shared memory ---------------------------------------------------------------------------

def _gpu_count() -> int:
    try:
        from cuda.bindings import runtime
    except ImportError:
        return 0
    error, count = runtime.cudaGetDeviceCount()
    return count if int(error) == 0 else 0


def test_cuda_registration_without_a_gpu_fails_clearly(api: Api, segment: Callable[[int], Segment]) -> None:
    if _gpu_count():
        pytest.skip("a GPU is present; test_cuda_shared_memory_round_trip covers registration")
    region = segment(256)
    api.register("sys", region.key, 256)
    api.fails(Status.INVALID_ARG, "failed to register CUDA shared memory region: 'gpu', GPUs not supported",
              api.client.register_cuda_shared_memory, "gpu", base64.b64encode(bytes(64)), 0, 64)
    status = api.client.get_cuda_shared_memory_status()
    assert (status == []) if api.protocol == "http" else not status.regions
    api.client.unregister_cuda_shared_memory()
    assert api.status() == {"sys": (region.key, 0, 256)}


@pytest.mark.gpu
def test_cuda_shared_memory_round_trip(tmp_path: Path) -> None:
    """Inputs copied from and outputs into CUDA regions, through both clients. The server runs in its own
    process: CUDA cannot open an IPC handle in the process that exported it."""
    if not _gpu_count():
        pytest.skip("no CUDA device (or no cuda-python)")
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except (ImportError, RuntimeError) as error:
        pytest.skip(f"tritonclient's CUDA utilities are unavailable: {error}")
    http_port, grpc_port = free_port(), free_port()
    repository = EXAMPLE_REPOSITORY
    process = subprocess.Popen(
        [sys.executable, "-c", "from triton_serve._engine.cli import main; raise SystemExit(main())",
         f"--model-repository={repository}", "--model-control-mode=explicit", "--load-model=add_sub",
         f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={free_port()}",
         "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--frontend-processes=0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not _ready(http_port):
            assert time.monotonic() < deadline and process.poll() is None, "the server did not become ready"
            time.sleep(0.2)
        a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 2, dtype=np.int32)
        for protocol, module, url in (("http", httpclient, f"127.0.0.1:{http_port}"),
                                      ("grpc", grpcclient, f"127.0.0.1:{grpc_port}")):
            client = module.InferenceServerClient(url)
            inputs_region = cudashm.create_shared_memory_region(f"{protocol}_in", 2 * TENSOR_BYTES, 0)
            outputs_region = cudashm.create_shared_memory_region(f"{protocol}_out", 2 * TENSOR_BYTES, 0)
            try:
                cudashm.set_shared_memory_region(inputs_region, [a, b])
                client.register_cuda_shared_memory("in", cudashm.get_raw_handle(inputs_region), 0, 2 * TENSOR_BYTES)
                client.register_cuda_shared_memory("out", cudashm.get_raw_handle(outputs_region), 0, 2 * TENSOR_BYTES)
                status = client.get_cuda_shared_memory_status()
                names = [r["name"] for r in status] if protocol == "http" else list(status.regions)
                assert sorted(names) == ["in", "out"]
                inputs = [module.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
                outputs = [module.InferRequestedOutput(f"OUTPUT{i}") for i in (0, 1)]
                for i in (0, 1):
                    inputs[i].set_shared_memory("in", TENSOR_BYTES, offset=i * TENSOR_BYTES)
                    outputs[i].set_shared_memory("out", TENSOR_BYTES, offset=i * TENSOR_BYTES)
                client.infer("add_sub", inputs, outputs=outputs)
                both = cudashm.get_contents_as_numpy(outputs_region, np.int32, [2, 16])
                assert both.tolist() == [(a + b)[0].tolist(), (a - b)[0].tolist()]
                client.unregister_cuda_shared_memory()
            finally:
                cudashm.destroy_shared_memory_region(inputs_region)
                cudashm.destroy_shared_memory_region(outputs_region)
                client.close()
    finally:
        process.terminate()
        process.communicate(timeout=60)


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200
    except httpx.TransportError:
        return False


def test_allow_client_shm_false_refuses_registration(add_model: Callable[..., Path], toy_server: Callable[..., Any],
                                                      protocol: str, segment: Callable[[int], Segment]) -> None:
    """--allow-client-shm=false (Triton 2.69): every register and unregister, system and CUDA, gets Triton's
    UNSUPPORTED error (HTTP 501, gRPC UNIMPLEMENTED); status still answers, with nothing registered."""
    add_model("add_sub", ADD_SUB)
    api = Api(protocol, toy_server(allow_client_shm=False))
    try:
        disabled = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
        region = segment(TENSOR_BYTES)
        api.fails(Status.UNSUPPORTED, disabled, api.register, "refused", region.key, TENSOR_BYTES)
        api.fails(Status.UNSUPPORTED, disabled, api.unregister, "refused")
        api.fails(Status.UNSUPPORTED, disabled, api.unregister)
        handle = base64.b64encode(bytes(64))  # HTTP wants it encoded; either way the server refuses first
        api.fails(Status.UNSUPPORTED, disabled, api.client.register_cuda_shared_memory, "gpu", handle, 0, 8)
        api.fails(Status.UNSUPPORTED, disabled, api.client.unregister_cuda_shared_memory, "gpu")
        assert api.status() == {}
    finally:
        api.close()
