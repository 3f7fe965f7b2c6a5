"""The floor: the least a Python server with its model in another process can do per request, for ``add_sub``.

Nothing of triton-serve runs here. One asyncio protocol on httptools + uvloop reads binary KServe ``/infer``
requests for the example ``add_sub`` (INT32 [1, 16] inputs), sends their two input blobs to a worker process over
a socketpair (length-prefixed frames; the writes of one event-loop turn leave in one send), the worker adds and
subtracts with numpy and answers in kind, and the response goes out in one write. It answers the few GETs
perf_analyzer makes (ready, metadata, config, statistics) with fixed documents. No validation, no statistics, no
scheduling: what is left is the protocol, two process hops and the event loop, which any process-isolated Python
server pays. ``run_add_sub.py --servers floor`` measures it beside ours and Triton, so each cell of ours has its
bound from the same run.

    .venv/bin/python bench/floor_server.py --http-port 8000     # the flags it does not know are ignored
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct

import httptools
import numpy as np
import uvloop

FRAME = struct.Struct("<II")  # request id, payload bytes
ELEMENTS = 16
TENSOR = ELEMENTS * 4  # one INT32 [1, 16] tensor
_io = {"datatype": "INT32", "shape": [-1, ELEMENTS]}
SERVER = json.dumps({"name": "floor", "version": "2.51.0", "extensions": ["binary_tensor_data", "statistics"]}).encode()
METADATA = json.dumps({"name": "add_sub", "versions": ["1"], "platform": "python",
                       "inputs": [{"name": f"INPUT{i}", **_io} for i in (0, 1)],
                       "outputs": [{"name": f"OUTPUT{i}", **_io} for i in (0, 1)]}).encode()
_dims = {"data_type": "TYPE_INT32", "dims": [ELEMENTS]}
CONFIG = json.dumps({"name": "add_sub", "backend": "python", "max_batch_size": 8,
                     "input": [{"name": f"INPUT{i}", **_dims} for i in (0, 1)],
                     "output": [{"name": f"OUTPUT{i}", **_dims} for i in (0, 1)],
                     "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}).encode()
ANSWER_HEADER = json.dumps({"model_name": "add_sub", "model_version": "1", "outputs": [
    {"name": f"OUTPUT{i}", "datatype": "INT32", "shape": [1, ELEMENTS], "parameters": {"binary_data_size": TENSOR}}
    for i in (0, 1)]}).encode()
ANSWER_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
               b"inference-header-content-length: %d\r\ncontent-length: %d\r\n\r\n"
               % (len(ANSWER_HEADER), len(ANSWER_HEADER) + 2 * TENSOR)) + ANSWER_HEADER


def _stats(count: int) -> bytes:
    zero = {"count": 0, "ns": 0}
    done = {"count": count, "ns": 0}
    return json.dumps({"model_stats": [{
        "name": "add_sub", "version": "1", "last_inference": 0, "inference_count": count, "execution_count": count,
        "inference_stats": {"success": done, "fail": zero, "queue": done, "compute_input": done,
                            "compute_infer": done, "compute_output": done, "cache_hit": zero, "cache_miss": zero},
        "batch_stats": []}]}).encode()


def worker(sock: socket.socket) -> None:
    """The model's process: read every frame available, answer them all in one send."""
    buffer = bytearray()
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return
        buffer += data
        replies, start = [], 0
        while len(buffer) - start >= FRAME.size:
            request_id, size = FRAME.unpack_from(buffer, start)
            end = start + FRAME.size + size
            if end > len(buffer):
                break
            inputs = np.frombuffer(bytes(buffer[start + FRAME.size:end]), np.int32).reshape(2, ELEMENTS)
            a, b = inputs[0], inputs[1]
            replies += [FRAME.pack(request_id, 2 * TENSOR), (a + b).tobytes(), (a - b).tobytes()]
            start = end
        del buffer[:start]
        if replies:
            sock.sendall(b"".join(replies))


class Worker(asyncio.Protocol):
    """The owner's end of the socketpair: frames out (one send per loop turn), replies to their connections."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: dict[int, HttpConnection] = {}
        self.next_id = 0
        self.outgoing: list[bytes] = []
        self.buffer = bytearray()
        self.count = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, connection: HttpConnection, a: bytes, b: bytes) -> None:
        self.next_id += 1
        self.waiting[self.next_id] = connection
        if not self.outgoing:
            asyncio.get_running_loop().call_soon(self.flush)
        self.outgoing += [FRAME.pack(self.next_id, 2 * TENSOR), a, b]

    def flush(self) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(self.outgoing))
        self.outgoing.clear()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        start = 0
        while len(buffer) - start >= FRAME.size:
            request_id, size = FRAME.unpack_from(buffer, start)
            end = start + FRAME.size + size
            if end > len(buffer):
                break
            self.count += 1
            connection = self.waiting.pop(request_id)
            if not connection.closed:
                connection.transport.write(ANSWER_HEAD + buffer[start + FRAME.size:end])  # type: ignore[union-attr]
            start = end
        del buffer[:start]


class HttpConnection(asyncio.Protocol):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.header_length = 0
        self.body: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"inference-header-content-length":
            self.header_length = int(value)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        self.body.clear()
        assert self.transport is not None
        if self.parser.get_method() == b"POST" and self.url.endswith(b"/infer"):
            header = json.loads(body[:self.header_length])
            blobs = body[self.header_length:]
            assert [i["parameters"]["binary_data_size"] for i in header["inputs"]] == [TENSOR, TENSOR]
            self.worker.send(self, blobs[:TENSOR], blobs[TENSOR:])
            return
        path = self.url.split(b"?")[0].rstrip(b"/")
        reply = {b"/v2": SERVER, b"/v2/models/add_sub": METADATA, b"/v2/models/add_sub/config": CONFIG,
                 b"/v2/models/add_sub/stats": _stats(self.worker.count)}.get(path, b"")
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(reply), reply))


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    owner_end, worker_end = socket.socketpair()
    if os.fork() == 0:
        owner_end.close()
        worker(worker_end)
        os._exit(0)
    worker_end.close()
    _, model = await loop.connect_accepted_socket(Worker, owner_end)
    server = await loop.create_server(lambda: HttpConnection(model), "127.0.0.1", port)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--http-port", type=int, default=8000)
    args, _ = parser.parse_known_args()
    uvloop.run(serve(args.http_port))


if __name__ == "__main__":
    main()
