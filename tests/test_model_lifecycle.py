"""Backend -> model -> instance: a version's Model loads before its instances and unloads after them, its
instances share it, a failed load unloads what loaded, and each FrameworkInstance runs on its own thread."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_serve.plugin import (Backend, BackendRegistry, FrameworkInstance, InstanceSpec, Model, ModelInstance,
                                 ModelSpec, ServerError, hookimpl)


class Event:
    """What a recording model or instance did, where, for which model object."""

    def __init__(self, what: str, name: str, model: Model) -> None:
        self.what = what
        self.name = name
        self.model = model
        self.thread = threading.current_thread()

    def __repr__(self) -> str:
        return f"{self.what}({self.name})"


EVENTS: list[Event] = []  # appended from the event loop and from instance threads (list.append is atomic)


def _parameter(spec: ModelSpec, key: str) -> str:
    parameters = spec.config.parameters
    return parameters[key].string_value if key in parameters else ""


class _RecordingModel(Model):
    """Config parameters: ``fail_model_load``, ``refuse_instance`` (an instance name), ``fail_open`` (an
    instance name)."""

    async def load(self) -> None:
        EVENTS.append(Event("model.load", self.spec.name, self))
        if _parameter(self.spec, "fail_model_load"):
            raise ServerError(f"model '{self.spec.name}' refuses to load")

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        if _parameter(self.spec, "refuse_instance") == instance.name:
            raise ServerError(f"instance '{instance.name}' is refused")
        EVENTS.append(Event("create", instance.name, self))
        return _RecordingInstance(self, instance)

    async def unload(self) -> None:
        EVENTS.append(Event("model.unload", self.spec.name, self))


class _RecordingInstance(FrameworkInstance):
    def open(self) -> None:
        EVENTS.append(Event("open", self.spec.name, self.model))
        if _parameter(self.model.spec, "fail_open") == self.spec.name:
            raise ServerError(f"instance '{self.spec.name}' cannot open")

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        EVENTS.append(Event("run", self.spec.name, self.model))
        return {"OUTPUT0": inputs["INPUT0"] * 2}

    def close(self) -> None:
        EVENTS.append(Event("close", self.spec.name, self.model))

    async def unload(self) -> None:
        EVENTS.append(Event("unload", self.spec.name, self.model))
        await super().unload()


class _RecordingBackend(Backend):
    name = "recording"

    def create_model(self, spec: ModelSpec) -> Model:
        return _RecordingModel(self, spec)


class _RecordingPlugin:
    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(_RecordingBackend)


def config(count: int, **parameters: str) -> str:
    written = "".join(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
                      for key, value in parameters.items())
    return f"""
backend: "recording"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ kind: KIND_CPU count: {count} }} ]
{written}"""


@pytest.fixture
def client(repo: Path, tserve: Callable[..., Any]) -> Iterator[httpclient.InferenceServerClient]:
    """An HTTP client of a server in explicit model-control mode with the recording backend."""
    EVENTS.clear()
    server = tserve(repo, model_control_mode="explicit", extra_plugins=[("recording", _RecordingPlugin())])
    with httpclient.InferenceServerClient(server.http_url) as made:
        yield made


def infer(client: httpclient.InferenceServerClient, model: str) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1.5, -2.0]], np.float32))
    return client.infer(model, [tensor]).as_numpy("OUTPUT0")


def whats(events: list[Event]) -> list[str]:
    return [event.what for event in events]


def test_a_model_loads_before_its_instances_and_unloads_after_them(add_model, client) -> None:  # type: ignore[no-untyped-def]
    add_model("m", config(2))
    client.load_model("m")
    np.testing.assert_array_equal(infer(client, "m"), [[3.0, -4.0]])
    client.unload_model("m")

    assert whats(EVENTS[:3]) == ["model.load", "create", "create"]
    assert sorted(whats(EVENTS[3:5])) == ["open", "open"]
    assert EVENTS[5].what == "run" and EVENTS[-1].what == "model.unload"
    assert sorted(whats(EVENTS[6:-1])) == ["close", "close", "unload", "unload"]
    assert {event.name for event in EVENTS if event.what == "close"} == {"m_0_0", "m_0_1"}
    model = EVENTS[0].model  # the one Model both instances were made by and belong to
    assert all(event.model is model for event in EVENTS)
    assert isinstance(model, _RecordingModel) and model.spec.name == "m" and model.spec.version == 1


def test_each_framework_instance_opens_runs_and_closes_on_a_thread_of_its_own(add_model, client) -> None:  # type: ignore[no-untyped-def]
    add_model("m", config(2))
    client.load_model("m")
    for _ in range(4):
        infer(client, "m")
    client.unload_model("m")

    loop_thread = EVENTS[0].thread  # Model.load runs on the server's event loop
    threads = {event.name: event.thread for event in EVENTS if event.what == "open"}
    assert set(threads) == {"m_0_0", "m_0_1"}
    assert threads["m_0_0"] is not threads["m_0_1"]
    for name, thread in threads.items():
        assert thread is not loop_thread and thread.name == f"m/1/{name}"
        mine = [event for event in EVENTS if event.name == name and event.what in ("open", "run", "close")]
        assert mine[0].what == "open" and mine[-1].what == "close" and whats(mine[1:-1]) == ["run"] * (len(mine) - 2)
        assert all(event.thread is thread for event in mine)
        thread.join(10)
        assert not thread.is_alive()  # the thread ends once the instance closed
    assert sum(1 for event in EVENTS if event.what == "run") == 4
    assert EVENTS[-1].what == "model.unload" and EVENTS[-1].thread is loop_thread


def test_a_failed_instance_load_unloads_the_loaded_instances_then_the_model(add_model, client) -> None:  # type: ignore[no-untyped-def]
    add_model("m", config(3, fail_open="m_0_1"))
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("m")
    assert "instance 'm_0_1' cannot open" in raised.value.message()
    assert not client.is_model_ready("m")

    assert sorted(event.name for event in EVENTS if event.what == "open") == ["m_0_0", "m_0_1", "m_0_2"]
    for what in ("unload", "close"):  # only the instances whose load returned are unloaded
        assert sorted(event.name for event in EVENTS if event.what == what) == ["m_0_0", "m_0_2"]
    assert EVENTS[-1].what == "model.unload" and "model.unload" not in whats(EVENTS[:-1])
    for event in EVENTS:
        if event.what == "open":
            event.thread.join(10)
            assert not event.thread.is_alive()  # the failed instance's thread ended too


def test_a_failed_model_load_creates_no_instance_and_is_not_unloaded(add_model, client) -> None:  # type: ignore[no-untyped-def]
    add_model("m", config(2, fail_model_load="yes"))
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("m")
    assert "model 'm' refuses to load" in raised.value.message()
    assert whats(EVENTS) == ["model.load"]


def test_a_refused_instance_fails_the_load_and_unloads_the_model(add_model, client) -> None:  # type: ignore[no-untyped-def]
    add_model("m", config(2, refuse_instance="m_0_1"))
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("m")
    assert "instance 'm_0_1' is refused" in raised.value.message()
    assert whats(EVENTS) == ["model.load", "create", "model.unload"]  # the created instance never loaded


def test_each_version_has_its_own_model(add_model, client) -> None:  # type: ignore[no-untyped-def]
    add_model("m", config(1) + "version_policy { all { } }", versions=(1, 2))
    client.load_model("m")
    client.unload_model("m")
    loaded = {event.model.spec.version: event.model for event in EVENTS if event.what == "model.load"}
    assert set(loaded) == {1, 2} and loaded[1] is not loaded[2]
    unloaded = [event.model for event in EVENTS if event.what == "model.unload"]
    assert len(unloaded) == 2 and {id(model) for model in unloaded} == {id(model) for model in loaded.values()}
