"""The ingress's data plane with stand-in deployment handles: every seam call forwarded (or refused, or answered
here), by position or by keyword; replica deaths, replica errors, unknown models, answers joined across models."""
from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

import pytest
from ray.exceptions import ActorDiedError

import triton_serve
from triton_serve.plugin import REMOTE_CALLS, ServerError, Status
from triton_serve_ray.ray_dataplane import ATTEMPTS, EXTENSIONS, REFUSED, RayDataPlane
from triton_serve_ray.replica import ModelReplica
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


class RecordingCall(StandInMethod):
    """``ModelReplica.call``, standing in: answers each seam call with one index-like entry naming the call."""

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model

    def remote(self, *args: Any) -> Coroutine[Any, Any, Any]:
        self.outcomes.append(Reply([{"name": self.model, "call": args}]))
        return super().remote(*args)


def plane_of(**calls: StandInMethod) -> RayDataPlane:
    return RayDataPlane({model: StandInHandle(call=call) for model, call in calls.items()}, "triton")  # type: ignore[misc]


# ---- every call of the seam ------------------------------------------------------------------------

ANSWERED_HERE = {"live": True, "server_metadata": {"name": "triton", "version": triton_serve.__version__,
                                                    "extensions": EXTENSIONS}}


@pytest.mark.parametrize("by", ["position", "keyword"])
@pytest.mark.parametrize("method", sorted(REMOTE_CALLS))
def test_every_seam_call_is_forwarded_refused_or_answered_here(method: str, by: str) -> None:
    arguments = {name: "m" if name == "name" else f"{method}.{name}" for name in REMOTE_CALLS[method].parameters}
    values = tuple(arguments.values())
    call = RecordingCall("m")
    plane = plane_of(m=call)
    bound = getattr(plane, method)
    answer = bound(*values) if by == "position" else bound(**arguments)
    if method in REFUSED:
        message, status = REFUSED[method]
        with pytest.raises(ServerError, match=re.escape(message)) as error:
            asyncio.run(answer)
        assert error.value.status is status and call.calls == []
    elif method in ANSWERED_HERE:
        assert asyncio.run(answer) == ANSWERED_HERE[method] and call.calls == []
    elif method == "server_ready":  # every deployment's model is ready
        assert asyncio.run(answer) is True and call.calls == [("model_ready", ("m", None))]
    else:
        sent = (method, values)
        assert asyncio.run(answer) == (True if method == "model_ready" else [{"name": "m", "call": sent}])
        assert call.calls == [sent]


def test_what_is_refused_is_a_call_of_the_seam() -> None:
    assert set(REFUSED) <= set(REMOTE_CALLS)


def test_a_wrong_argument_fails_at_the_call() -> None:
    plane = plane_of(m=RecordingCall("m"))
    with pytest.raises(TypeError, match="unexpected keyword argument 'model'"):
        plane.model_metadata("m", model=1)
    with pytest.raises(AttributeError, match="'RayDataPlane' object has no attribute 'model_readiness'"):
        plane.model_readiness("m")  # type: ignore[attr-defined]


def test_a_call_that_names_no_model_joins_every_models_own_entries() -> None:
    """Each replica's repository holds the other models too: only each deployment's own entries are kept."""
    index = {model: StandInMethod(Reply([{"name": "a", "state": state}, {"name": "b", "state": state}]))
             for model, state in (("a", "READY"), ("b", "UNAVAILABLE"))}
    plane = plane_of(**index)
    assert asyncio.run(plane.repository_index(ready_only=True)) == [{"name": "a", "state": "READY"},
                                                                    {"name": "b", "state": "UNAVAILABLE"}]
    assert index["a"].calls == index["b"].calls == [("repository_index", (True, ""))]


# ---- replicas ----------------------------------------------------------------------------------

class ReplicaDataPlane:
    """A replica's data plane, standing in: its model is ready; it knows no version 2."""

    async def model_ready(self, name: str, version: int | None = None) -> bool:
        return True

    async def model_metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        if version == 2:
            raise ServerError(f"Request for unknown model: '{name}' version 2 is not found", Status.NOT_FOUND)
        return {"name": name}


def test_a_replica_answers_each_call_with_its_data_plane_and_errors_as_values() -> None:
    replica = SimpleNamespace(dataplane=ReplicaDataPlane())  # a replica without its server (nor Ray's __del__)

    def call(method: str, args: tuple[Any, ...]) -> Reply:
        return asyncio.run(ModelReplica.call(replica, method, args))  # type: ignore[arg-type]
    assert call("model_metadata", ("m", 1)).unwrap() == {"name": "m"}
    with pytest.raises(ServerError, match="version 2 is not found") as error:
        call("model_metadata", ("m", 2)).unwrap()
    assert error.value.status is Status.NOT_FOUND
    with pytest.raises(ServerError, match="'check_health' is not a call of the data-plane seam"):
        call("check_health", ()).unwrap()


def test_a_call_whose_replica_died_goes_to_another_replica() -> None:
    call = StandInMethod(ActorDiedError(), Reply({"name": "m"}))
    assert asyncio.run(plane_of(m=call).model_metadata("m", 1)) == {"name": "m"}
    assert call.calls == [("model_metadata", ("m", 1))] * 2


def test_a_call_gives_up_after_every_attempt_met_a_dead_replica() -> None:
    call = StandInMethod(*(ActorDiedError() for _ in range(ATTEMPTS)))
    with pytest.raises(ServerError, match=f"model 'm': no replica could answer \\({ATTEMPTS} tried\\)") as error:
        asyncio.run(plane_of(m=call).model_metadata("m"))
    assert error.value.status is Status.UNAVAILABLE


def test_a_replica_error_keeps_its_status_and_is_not_retried() -> None:
    call = StandInMethod(Reply.failed(ServerError("Request for unknown model: 'm' version 7 is not found",
                                                  Status.NOT_FOUND)))
    with pytest.raises(ServerError, match="version 7 is not found") as error:
        asyncio.run(plane_of(m=call).model_config_json("m", 7))
    assert error.value.status is Status.NOT_FOUND and len(call.calls) == 1


def test_a_model_without_a_deployment_is_unknown() -> None:
    plane = RayDataPlane({}, "triton")
    assert asyncio.run(plane.model_ready("nope")) is False
    with pytest.raises(ServerError, match="Request for unknown model: 'nope' is not found") as error:
        asyncio.run(plane.model_metadata("nope"))
    assert error.value.status is Status.NOT_FOUND
