"""Checking a config against the engine at load, and output shapes at run time: each error names model,
tensor and field."""
from __future__ import annotations

from typing import Any

import pytest
from triton_serve.plugin import ServerError, Status
from triton_serve_tensorrt.autocomplete import complete_config
from triton_serve_tensorrt.engine_description import EngineDescription
from triton_serve_tensorrt.validation import check_config_against_engine, resolve_output_shape

LINEAR = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def error(kit, config_text: str, engine: EngineDescription | None = None,
          profiles: tuple[int, ...] = (0,)) -> ServerError:
    with pytest.raises(ServerError) as caught:
        check_config_against_engine("m", kit.config(config_text), engine or kit.linear(), profiles)
    return caught.value


def test_a_matching_config_passes(kit: Any) -> None:
    check_config_against_engine("m", kit.config(LINEAR), kit.linear(), [0])


def test_every_auto_completed_config_passes(kit: Any) -> None:
    engines = [kit.linear(), kit.static(), kit.linear((1, 4, 8), (9, 16, 32)),
               EngineDescription((kit.tensor("X", (-1,), trt_type="INT64", profiles=(((1,), (1,), (4,)),)),
                                  kit.tensor("Y", (-1,), output=True, trt_type="INT64")))]
    for engine in engines:
        config = kit.config()
        complete_config("m", config, engine)
        check_config_against_engine("m", config, engine, [0])


def test_a_wrong_data_type_is_named(kit: Any) -> None:
    failure = error(kit, LINEAR.replace("data_type: TYPE_FP32 dims: [ 3 ]", "data_type: TYPE_FP16 dims: [ 3 ]"))
    assert failure.message == ("model 'm': output 'OUTPUT0': data_type is TYPE_FP16 in the config, "
                               "but the engine's tensor is TYPE_FP32")


def test_a_wrong_rank_is_named(kit: Any) -> None:
    failure = error(kit, LINEAR.replace("dims: [ 4 ]", "dims: [ 2, 2 ]"))
    assert failure.message == ("model 'm': input 'INPUT0': dims [2, 2] (after the batch dimension) does not match "
                               "the engine's shape [-1, 4]")


def test_a_fixed_engine_dim_must_match(kit: Any) -> None:
    failure = error(kit, LINEAR.replace("dims: [ 4 ]", "dims: [ 5 ]"))
    assert failure.message == ("model 'm': input 'INPUT0': dims[0] is 5 in the config, but the engine fixes "
                               "that dimension at 4")
    failure = error(kit, LINEAR.replace("dims: [ 3 ]", "dims: [ -1 ]"))
    assert failure.message == ("model 'm': output 'OUTPUT0': dims[0] is -1 in the config, but the engine fixes "
                               "that dimension at 3")


def test_reshape_is_what_the_engine_sees(kit: Any) -> None:
    reshaped = LINEAR.replace("dims: [ 4 ]", "dims: [ 2, 2 ] reshape { shape: [ 4 ] }")
    check_config_against_engine("m", kit.config(reshaped), kit.linear(), [0])
    failure = error(kit, LINEAR.replace("dims: [ 4 ]", "dims: [ 4 ] reshape { shape: [ 2, 2 ] }"))
    assert "input 'INPUT0': reshape.shape [2, 2] (after the batch dimension)" in failure.message


def test_a_fixed_config_dim_must_fit_a_profile_of_the_instance(kit: Any) -> None:
    engine = EngineDescription((
        kit.tensor("TOKENS", (-1, -1), trt_type="INT32", profiles=(((1, 1), (4, 16), (8, 32)),
                                                                   ((1, 33), (4, 64), (8, 128)))),
        kit.tensor("LOGITS", (-1, -1), output=True)), 2)
    text = """max_batch_size: 8
    input [ { name: "TOKENS" data_type: TYPE_INT32 dims: [ 64 ] } ]
    output [ { name: "LOGITS" data_type: TYPE_FP32 dims: [ 64 ] } ]"""
    check_config_against_engine("m", kit.config(text), engine, [1])
    failure = error(kit, text, engine, (0,))
    assert failure.message == ("model 'm': input 'TOKENS': dims[0] is 64 in the config, which no optimization "
                               "profile this instance uses allows (profile 0: 1..32)")


def test_batching_needs_dynamic_first_dims(kit: Any) -> None:
    failure = error(kit, """max_batch_size: 2
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]""", kit.static())
    assert failure.message == ("model 'm': max_batch_size is 2, but engine tensor(s) ['INPUT0', 'OUTPUT0'] have no "
                               "dynamic first dimension to batch along; set max_batch_size: 0")


def test_max_batch_size_must_fit_the_instance_profiles(kit: Any) -> None:
    engine = kit.linear((1, 4, 8), (9, 16, 32))
    text = LINEAR.replace("max_batch_size: 8", "max_batch_size: 32")
    check_config_against_engine("m", kit.config(text), engine, [0, 1])
    failure = error(kit, text, engine, (0,))
    assert failure.message == ("model 'm': max_batch_size is 32, but the optimization profile(s) [0] this "
                               "instance uses take batches of at most 8")


def test_every_engine_input_must_be_declared(kit: Any) -> None:
    engine = EngineDescription((kit.tensor("A", (2,)), kit.tensor("B", (2,)), kit.tensor("C", (2,), output=True)))
    failure = error(kit, """input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "C" data_type: TYPE_FP32 dims: [ 2 ] } ]""", engine)
    assert failure.message == ("model 'm': engine input 'B' is missing from the config's inputs; TensorRT needs a "
                               "value for every engine input")


def test_undeclared_engine_outputs_are_allowed(kit: Any) -> None:
    engine = EngineDescription((kit.tensor("A", (2,)), kit.tensor("C", (2,), output=True),
                                kit.tensor("D", (5,), output=True)))
    check_config_against_engine("m", kit.config("""input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "D" data_type: TYPE_FP32 dims: [ 5 ] } ]"""), engine, [0])


def test_unknown_tensors_are_named(kit: Any) -> None:
    failure = error(kit, LINEAR.replace('name: "OUTPUT0"', 'name: "PROBS"'))
    assert failure.message == ("model 'm': config output 'PROBS' is not an output of the engine; "
                               "its outputs are ['OUTPUT0']")


@pytest.mark.parametrize(("change", "expected"), [
    ('dims: [ 4 ] allow_ragged_batch: true', "input 'INPUT0' sets allow_ragged_batch"),
    ('dims: [ 4 ] optional: true', "input 'INPUT0' is optional, but a TensorRT engine needs a value for every input"),
    ('dims: [ 4 ] is_non_linear_format_io: true', "'INPUT0' sets is_non_linear_format_io"),
])
def test_unsupported_input_features_are_refused(kit: Any, change: str, expected: str) -> None:
    failure = error(kit, LINEAR.replace("dims: [ 4 ]", change))
    assert failure.status is Status.UNSUPPORTED
    assert failure.message.startswith("model 'm': ") and expected in failure.message


def test_batch_inputs_are_refused(kit: Any) -> None:
    failure = error(kit, LINEAR + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" '
                                  'data_type: TYPE_INT32 source_input: "INPUT0" } ]')
    assert failure.status is Status.UNSUPPORTED
    assert "batch_input and batch_output are not supported" in failure.message


def test_engines_with_shape_tensors_are_refused(kit: Any) -> None:
    engine = EngineDescription((kit.tensor("X", (3,)), kit.tensor("SHAPE", (2,), trt_type="INT32", shape_tensor=True),
                                kit.tensor("Y", (3,), output=True)))
    config = kit.config()
    complete_config("m", config, engine)
    with pytest.raises(ServerError) as caught:
        check_config_against_engine("m", config, engine, [0])
    assert caught.value.status is Status.UNSUPPORTED
    assert caught.value.message == ("model 'm': engine tensor 'SHAPE' is a shape tensor; this backend does not "
                                    "serve engines with shape tensors")


def test_concrete_output_shapes_pass_and_data_dependent_ones_are_unsupported() -> None:
    assert resolve_output_shape("m", "OUTPUT0", (3, 4)) == (3, 4)
    assert resolve_output_shape("m", "OUTPUT0", ()) == ()
    with pytest.raises(ServerError) as caught:
        resolve_output_shape("nms", "BOXES", (3, -1, 4))
    assert caught.value.status is Status.UNSUPPORTED
    assert caught.value.message == ("model 'nms': output 'BOXES' has shape [3, -1, 4] after the input shapes are set; "
                                    "outputs whose shape depends on input values are not supported")
