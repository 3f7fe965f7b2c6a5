"""A field added to the content types crosses every process boundary with no other change: front-end processes,
the Python backend's worker, and the TCP channel that triton-serve-ray's front door routes over.

``content_fields.py`` subclasses RequestContent and ResponseContent with a ``tag`` field (made once per content)
and notes every content made or received, with the process holding it. The test process (the model owner) sets
them as its content types; the processes it starts are told so (``wire.content_type_names``) and import them."""
from __future__ import annotations

import asyncio
import importlib
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as http

from triton_serve.plugin import (InferenceRequest, InferenceResponse, RemoteDataPlane, Server, ServerOptions, Tensor,
                                 serve_channel)

ECHO = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""
ECHO_CONFIG = """
input [{ name: "X", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "Y", data_type: TYPE_FP32, dims: [ 4 ] }]
"""
X = np.arange(4, dtype=np.float32)


@pytest.fixture
def notes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The tagged content types in this process and every process it starts; the file their notes go to."""
    here = str(Path(__file__).parent)
    monkeypatch.syspath_prepend(here)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    path = tmp_path / "notes"
    monkeypatch.setenv("CONTENT_FIELDS_LOG", str(path))
    content_fields = importlib.import_module("content_fields")
    monkeypatch.setattr(InferenceRequest, "content_type", content_fields.TaggedRequest)
    monkeypatch.setattr(InferenceResponse, "content_type", content_fields.TaggedResponse)
    return path


def holders(path: Path, kind: str) -> dict[str, set[int]]:
    """Each tag of a ``kind`` content noted, and the processes that held a content with it."""
    held: dict[str, set[int]] = defaultdict(set)
    for line in path.read_text().splitlines():
        noted, tag, pid = line.split()
        if noted == kind:
            held[tag].add(int(pid))
    return held


def made_in(tag: str) -> int:
    return int(tag.split(":")[0])


def test_a_field_added_to_the_content_types_crosses_front_end_processes_and_the_python_worker(
        notes: Path, kit: Any, python_server: Any, tmp_path: Path) -> None:
    kit.write_model(tmp_path / "repo", "echo", ECHO, ECHO_CONFIG)
    server = python_server(tmp_path / "repo", frontend_processes=2)
    with http.InferenceServerClient(server.http_url) as client:
        assert kit.infer(client, "echo", X=X).as_numpy("Y").tolist() == X.tolist()
    owner, frontends = os.getpid(), set(server.server.frontends.pids())
    # the request: made in a front-end process, received by the owner, which passes it on to the python worker
    [(tag, held)] = [(tag, pids) for tag, pids in holders(notes, "request").items() if made_in(tag) in frontends]
    assert owner in held and len(held - frontends - {owner}) == 1, held  # the third: the worker
    # the response: made by the worker, received by the owner, which passes it on to a front-end process
    [(tag, held)] = [(tag, pids) for tag, pids in holders(notes, "response").items()
                     if made_in(tag) not in frontends | {owner}]
    assert owner in held and held & frontends, held


def test_a_field_added_to_the_content_types_crosses_the_tcp_channel(notes: Path, kit: Any, tmp_path: Path,
                                                                    shm_prefix: str) -> None:
    """The channel triton-serve-ray's front door routes over, to a model owner serving it on a TCP port, and on
    from that owner to its python worker; the response back the same way."""
    kit.write_model(tmp_path / "repo", "echo", ECHO, ECHO_CONFIG)
    content_type = InferenceRequest.content_type

    async def infer() -> InferenceResponse:
        server = Server(ServerOptions(model_repositories=[str(tmp_path / "repo")], allow_http=False, allow_grpc=False,
                                      allow_metrics=False,
                                      backend_config={"python": {"shm-region-prefix-name": shm_prefix}}))
        await server.start()
        listener = await serve_channel(server.dataplane, "127.0.0.1", 0)
        remote = RemoteDataPlane()
        try:
            await remote.connect_tcp("127.0.0.1", listener.port)
            request = InferenceRequest.from_content(content_type(
                "echo", inputs=(Tensor("X", "FP32", (4,), X),), tag="sent:1"))  # type: ignore[call-arg]
            remote.submit(request)
            return await asyncio.wait_for(request.single_response(), 120)
        finally:
            remote.close()
            listener.close()
            await server.stop()

    response = asyncio.run(infer())
    assert response.error is None and response.outputs[0].data.tolist() == X.tolist()
    held = holders(notes, "request")["sent:1"]
    assert os.getpid() in held and len(held) == 2, held  # this process (both ends of the channel), the worker
    tag = response.content.tag  # type: ignore[attr-defined]
    assert made_in(tag) in held - {os.getpid()}  # made by the worker, received over the channel
