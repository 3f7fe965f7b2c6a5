"""Every call of the data-plane seam crosses from a front-end process to the model owner (``RemoteDataPlane`` over a
real channel to the owner's ``_Endpoint``), its arguments given by position or by keyword: the owner's data plane
gets them all, in the seam's order, and its answer comes back. (triton-serve-ray's forwarder: its test_dataplane.py.)"""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from triton_serve._engine.errors import ServerError, Status
from triton_serve._engine.frontend.process import RemoteDataPlane
from triton_serve._engine.frontend_pool import _Endpoint
from triton_serve._engine.protos.model_config_pb2 import ModelConfig
from triton_serve._engine.seam import REMOTE_CALLS


class RecordingOwner:
    """The owner's data plane, standing in: each seam call is recorded and answered with what it got."""

    trace_armed = False

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        if method not in REMOTE_CALLS:
            raise AttributeError(method)

        async def answer(*args: Any) -> Any:
            self.calls.append((method, args))
            return ModelConfig(name=repr(args)) if method == "model_config" else [method, *args]
        return answer


def through_the_channel(call: Callable[[RemoteDataPlane], Awaitable[Any]]) -> tuple[Any, RecordingOwner]:
    """``call``'s answer, made by a front-end's RemoteDataPlane through a channel to an owner, and that owner."""
    owner = RecordingOwner()

    async def run() -> Any:
        loop = asyncio.get_running_loop()
        owner_end, frontend_end = socket.socketpair()
        owner_transport, _ = await loop.create_unix_connection(
            lambda: _Endpoint(owner, loop.create_future()), sock=owner_end)  # type: ignore[arg-type]
        remote = RemoteDataPlane()
        await remote.connect(frontend_end)
        try:
            return await asyncio.wait_for(call(remote), 10)
        finally:
            owner_transport.close()
            remote._writer.transport.close()  # type: ignore[union-attr]
    return asyncio.run(run()), owner


def sample_arguments(method: str) -> dict[str, str]:
    return {name: f"{method}.{name}" for name in REMOTE_CALLS[method].parameters}


@pytest.mark.parametrize("by", ["position", "keyword"])
@pytest.mark.parametrize("method", sorted(REMOTE_CALLS))
def test_every_seam_call_reaches_the_owner_with_its_arguments(method: str, by: str) -> None:
    arguments = sample_arguments(method)
    values = tuple(arguments.values())
    answer, owner = through_the_channel(
        lambda remote: getattr(remote, method)(*values) if by == "position" else getattr(remote, method)(**arguments))
    assert owner.calls == [(method, values)]
    if method == "model_config":  # crosses as bytes, becomes the message again
        assert answer == ModelConfig(name=repr(values))
    elif method == "server_ready":  # and the front-end process still accepts requests
        assert answer is True
    else:
        assert answer == [method, *values]


def test_the_seams_defaults_fill_in_what_a_call_leaves_out() -> None:
    answer, owner = through_the_channel(lambda remote: remote.model_statistics(version=3))
    assert owner.calls == [("model_statistics", ("", 3))] and answer == ["model_statistics", "", 3]
    _, owner = through_the_channel(lambda remote: remote.repository_index(repository="r"))
    assert owner.calls == [("repository_index", (False, "r"))]


def test_a_wrong_argument_fails_at_the_call_as_it_would_in_the_owner() -> None:
    async def misnamed(remote: RemoteDataPlane) -> None:
        with pytest.raises(TypeError, match="unexpected keyword argument 'model'"):
            remote.model_ready("m", model=1)
        with pytest.raises(TypeError, match="missing a required argument: 'name'"):
            remote.model_metadata()
        with pytest.raises(AttributeError, match="'RemoteDataPlane' object has no attribute 'model_readiness'"):
            remote.model_readiness("m")  # type: ignore[attr-defined]
    _, owner = through_the_channel(misnamed)
    assert owner.calls == []


def test_the_owner_answers_only_calls_of_the_seam() -> None:
    async def not_a_call(remote: RemoteDataPlane) -> None:
        with pytest.raises(ServerError, match="'submit' is not a call of the data-plane seam") as error:
            await remote.forward("submit", {})
        assert error.value.status is Status.INTERNAL
    _, owner = through_the_channel(not_a_call)
    assert owner.calls == []
