"""The ingress's data plane with stand-in deployment handles: replica deaths, replica errors, unknown models."""
from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from ray.exceptions import ActorDiedError

from triton_serve.plugin import ServerError, Status
from triton_serve_ray.ray_dataplane import ATTEMPTS, RayDataPlane
from triton_serve_ray.wire import Reply


class StandInMethod:
    """A handle method whose calls answer with ``outcomes`` in turn (an exception is raised)."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[Any, ...]] = []

    def remote(self, *args: Any) -> Coroutine[Any, Any, Any]:
        self.calls.append(args)
        outcome = self.outcomes.pop(0)

        async def answer() -> Any:
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        return answer()


class StandInHandle:
    def __init__(self, **methods: StandInMethod) -> None:
        self.__dict__.update(methods)


def test_a_call_whose_replica_died_goes_to_another_replica() -> None:
    metadata = StandInMethod(ActorDiedError(), Reply({"name": "m"}))
    plane = RayDataPlane({"m": StandInHandle(model_metadata=metadata)}, "triton")  # type: ignore[dict-item]
    assert asyncio.run(plane.model_metadata("m", 1)) == {"name": "m"}
    assert metadata.calls == [(1,), (1,)]


def test_a_call_gives_up_after_every_attempt_met_a_dead_replica() -> None:
    metadata = StandInMethod(*(ActorDiedError() for _ in range(ATTEMPTS)))
    plane = RayDataPlane({"m": StandInHandle(model_metadata=metadata)}, "triton")  # type: ignore[dict-item]
    with pytest.raises(ServerError, match=f"model 'm': no replica could answer \\({ATTEMPTS} tried\\)") as error:
        asyncio.run(plane.model_metadata("m"))
    assert error.value.status is Status.UNAVAILABLE


def test_a_replica_error_keeps_its_status_and_is_not_retried() -> None:
    config = StandInMethod(Reply.failed(ServerError("Request for unknown model: 'm' version 7 is not found",
                                                    Status.NOT_FOUND)))
    plane = RayDataPlane({"m": StandInHandle(model_config_json=config)}, "triton")  # type: ignore[dict-item]
    with pytest.raises(ServerError, match="version 7 is not found") as error:
        asyncio.run(plane.model_config_json("m", 7))
    assert error.value.status is Status.NOT_FOUND and len(config.calls) == 1


def test_a_model_without_a_deployment_is_unknown() -> None:
    plane = RayDataPlane({}, "triton")
    assert asyncio.run(plane.model_ready("nope")) is False
    with pytest.raises(ServerError, match="Request for unknown model: 'nope' is not found") as error:
        asyncio.run(plane.model_metadata("nope"))
    assert error.value.status is Status.NOT_FOUND
