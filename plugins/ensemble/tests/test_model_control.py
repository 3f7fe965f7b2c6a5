"""Ensemble config errors with Triton's words, and model control: composing models load with their
ensemble, and unloading one with ``unload_dependents`` unloads the ensemble."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

ADD_SUB = """
backend: "toy_add_sub"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    """One ``ensemble_scheduling`` step in config text."""
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version}{maps} }}'


def tensor(name: str, dims: str = "[ 2 ]", datatype: str = "TYPE_FP32", extra: str = "") -> str:
    return f'{{ name: "{name}" data_type: {datatype} dims: {dims} {extra}}}'


def ensemble(inputs: list[str], outputs: list[str], steps: list[str], extra: str = "",
             max_batch_size: int = 0) -> str:
    """An ensemble config: ``inputs``/``outputs`` from ``tensor``, ``steps`` from ``step``."""
    return (f'platform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
            f'input [ {", ".join(inputs)} ]\noutput [ {", ".join(outputs)} ]\n'
            f'ensemble_scheduling {{ step [ {", ".join(steps)} ] {extra}}}\n')


# sum = A + B, diff = A - B; OUT = sum + diff (= 2A)
TWO_STEPS = ensemble(
    [tensor("A"), tensor("B")], [tensor("OUT"), tensor("SUM")],
    [step("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM", "OUTPUT1": "diff"}),
     step("add_sub", {"INPUT0": "SUM", "INPUT1": "diff"}, {"OUTPUT0": "OUT"})])


BROKEN = ADD_SUB + 'parameters { key: "fail_load" value: { string_value: "yes" } }\n'
AB = [tensor("A"), tensor("B")]
ADD = {"INPUT0": "A", "INPUT1": "B"}

# (ensemble config, the words its load fails with)
INVALID = [
    (ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "SUM"})]),
     "ensemble output 'OUT' for ensemble e' is not used"),
    (ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "x"}),
                                    step("add_sub", {"INPUT0": "x", "INPUT1": "ghost"}, {"OUTPUT0": "OUT"})]),
     "output 'OUT' for ensemble 'e' is not written: at least one of its depending tensors, 'ghost', is not connected"),
    (ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "OUT"}),
                                    step("add_sub", {"INPUT0": "x", "INPUT1": "y"}, {"OUTPUT0": "x"})]),
     "ensemble tensor 'x' is unused in ensemble 'e'"),  # x feeds the step that writes it
    (ensemble([tensor("A"), tensor("B"), tensor("C")], [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "OUT"})]),
     "ensemble input 'C' for ensemble e' is not used"),
    (ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "OUT", "OUTPUT1": "spare"})]),
     "ensemble tensor 'spare' is unused in ensemble 'e'"),
    # a cycle: t1 needs t2, which needs t1
    (ensemble(AB, [tensor("OUT")], [step("add_sub", {"INPUT0": "A", "INPUT1": "t2"}, {"OUTPUT0": "t1"}),
                                    step("add_sub", {"INPUT0": "B", "INPUT1": "t1"}, {"OUTPUT0": "t2"}),
                                    step("add_sub", {"INPUT0": "t1", "INPUT1": "t2"}, {"OUTPUT0": "OUT"})]),
     "output 'OUT' for ensemble 'e' is not written: at least one of its depending tensors, 't"),
    (ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "OUT"}),
                                    step("add_sub", ADD, {"OUTPUT1": "OUT"})]),
     "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'e' step 1"),
    (ensemble(AB, [tensor("OUT")], []), "must specify 'step' for ensemble 'e'"),
    (ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "OUT"})])
     + 'instance_group [ { count: 1 } ]\n', "instance group should not be specified for ensemble 'e'"),
    (ensemble(AB, [tensor("OUT")], [step("nope", ADD, {"OUTPUT0": "OUT"})]),
     "ensemble e contains models that are not available or ambiguous: nope"),
    (ensemble(AB, [tensor("OUT")], [step("broken", ADD, {"OUTPUT0": "OUT"})]),
     "ensemble 'e' depends on 'broken' which has no loaded version. Model 'broken' loading failed with error: "),
    (ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "OUT"}, version=7)]),
     "ensemble 'e' depends on 'add_sub' whose required version 7 is not loaded."),
    (ensemble(AB, [tensor("OUT")], [step("add_sub", {"INPUT0": "A", "INPUT1": "B", "NOPE": "A"}, {"OUTPUT0": "OUT"})]),
     "in ensemble e, ensemble tensor A is mapping to non-existing input NOPE in model add_sub"),
    (ensemble([tensor("A")], [tensor("OUT")], [step("add_sub", {"INPUT0": "A"}, {"OUTPUT0": "OUT"})]),
     "in ensemble e, input INPUT1 in model add_sub is not mapped to any ensemble tensors"),
    (ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"NOPE": "OUT"})]),
     "in ensemble e, ensemble tensor OUT is mapped from non-existing output NOPE in model add_sub"),
    (ensemble([tensor("A", datatype="TYPE_INT32"), tensor("B")], [tensor("OUT")],
              [step("add_sub", ADD, {"OUTPUT0": "OUT"})]),
     "in ensemble e, ensemble tensor A: inconsistent data type: TYPE_INT32 is inferred from model e while "
     "TYPE_FP32 is inferred from model add_sub"),
    (ensemble([tensor("A", "[ 3 ]"), tensor("B")], [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "OUT"})]),
     "in ensemble e, ensemble tensor A: inconsistent shape: [3] is inferred from model e while [-1,2] is "
     "inferred from model add_sub"),
    (ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "OUT"})], max_batch_size=4),
     "ensemble e allows maximum batch size 4, but it contains model add_sub which only allows maximum batch size "
     "to be 2"),
    (ensemble(AB, [tensor("OUT")], [step("e", ADD, {"OUTPUT0": "OUT"})]),
     "ensemble 'e' depends on 'e', which depends on 'e': circular dependency"),
]


@pytest.fixture
def explicit(add_model, serve):  # type: ignore[no-untyped-def]
    """An explicit-mode server over a repository holding add_sub and broken (nothing loaded)."""
    add_model("add_sub", ADD_SUB.replace("max_batch_size: 0", "max_batch_size: 2"))
    add_model("broken", BROKEN)
    return httpclient.InferenceServerClient(serve(model_control_mode="explicit").http_url)


def test_invalid_ensembles_fail_to_load_with_triton_words(explicit, repo) -> None:  # type: ignore[no-untyped-def]
    model_dir = repo / "e"
    (model_dir / "1").mkdir(parents=True)
    for config, words in INVALID:
        (model_dir / "config.pbtxt").write_text(config)
        with pytest.raises(InferenceServerException) as raised:
            explicit.load_model("e")
        assert words in raised.value.message(), (words, raised.value.message())
        assert not explicit.is_model_ready("e")


def test_model_control_loads_and_unloads_composing_models_as_triton_does(explicit, add_model) -> None:  # type: ignore[no-untyped-def]
    # what Triton 2.51 does, observed on it with the example repository's ensemble_add_sub
    add_model("double", ADD_SUB)
    add_model("e", ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "s"}),
                                                  step("double", {"INPUT0": "s", "INPUT1": "s"}, {"OUTPUT0": "OUT"})],
                            max_batch_size=2))

    def ready() -> list[bool]:
        return [explicit.is_model_ready(name) for name in ("e", "add_sub", "double")]

    explicit.load_model("e")  # loads its composing models
    assert ready() == [True, True, True]
    explicit.unload_model("e")  # alone: the composing models stay
    assert ready() == [False, True, True]
    explicit.load_model("e")
    explicit.unload_model("double")  # a composing model: the ensemble goes too, flag or not
    assert ready() == [False, True, False]
    explicit.unload_model("add_sub")
    explicit.load_model("add_sub")  # asked for: stays when the ensemble unloads with unload_dependents
    explicit.load_model("e")  # loads double for the ensemble
    explicit.unload_model("e", unload_dependents=True)
    assert ready() == [False, True, False]


def test_an_ensemble_whose_model_went_away_fails_its_requests_until_reloaded(explicit, add_model) -> None:  # type: ignore[no-untyped-def]
    add_model("e", ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "OUT"})], max_batch_size=2))
    explicit.load_model("e")
    inputs = [httpclient.InferInput(name, [1, 2], "FP32") for name in ("A", "B")]
    for given in inputs:
        given.set_data_from_numpy(np.ones((1, 2), np.float32))
    assert explicit.infer("e", inputs).as_numpy("OUT").tolist() == [[2, 2]]
    explicit.unload_model("add_sub")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'e'"):
        explicit.infer("e", inputs)
    explicit.load_model("e")
    assert explicit.infer("e", inputs).as_numpy("OUT").tolist() == [[2, 2]]


def test_without_the_plugin_an_ensemble_names_the_package_to_install(add_model, tserve, repo) -> None:  # type: ignore[no-untyped-def]
    add_model("e", ensemble(AB, [tensor("OUT")], [step("add_sub", ADD, {"OUTPUT0": "OUT"})]))
    server = tserve(repo, blocked_plugins=["ensemble"])
    [entry] = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    assert entry["state"] == "UNAVAILABLE"
    assert "'ensemble_scheduling' scheduler; install it with 'pip install triton-serve-ensemble'" in entry["reason"]


def test_ensembles_that_use_each_other_fail_to_load_instead_of_waiting_forever(add_model, serve) -> None:  # type: ignore[no-untyped-def]
    add_model("add_sub", ADD_SUB)
    for name, other in (("left", "right"), ("right", "left")):
        add_model(name, ensemble(AB, [tensor("OUT")], [step(other, {"A": "A", "B": "B"}, {"OUT": "OUT"})]))
    index = {m["name"]: m for m in httpclient.InferenceServerClient(serve().http_url).get_model_repository_index()}
    assert index["add_sub"]["state"] == "READY"
    for name in ("left", "right"):
        assert index[name]["state"] == "UNAVAILABLE" and "circular dependency" in index[name]["reason"], index[name]


def test_a_step_fed_by_two_decoupled_models_is_refused(explicit, add_model) -> None:  # type: ignore[no-untyped-def]
    int32 = 'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }{more} ]\n' \
            'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    add_model("repeat", 'backend: "toy_repeat"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
              + int32.replace("{more}", ""))
    add_model("add_int", 'backend: "toy_add_sub"\nmax_batch_size: 0\n'
              + int32.replace("{more}", ', { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1 ] }'))
    n, out = tensor("N", "[ 1 ]", "TYPE_INT32"), tensor("OUT", "[ 1 ]", "TYPE_INT32")
    add_model("e", ensemble([n], [out], [
        step("repeat", {"INPUT0": "N"}, {"OUTPUT0": "x"}), step("repeat", {"INPUT0": "N"}, {"OUTPUT0": "y"}),
        step("add_int", {"INPUT0": "x", "INPUT1": "y"}, {"OUTPUT0": "sum"}),
        step("repeat", {"INPUT0": "sum"}, {"OUTPUT0": "OUT"})]))
    with pytest.raises(InferenceServerException,
                       match="in ensemble e, step of model 'add_int' receives inputs originated from different "
                             "decoupled models"):
        explicit.load_model("e")
