"""Auto-complete from an engine description: Triton's TensorRT rules for IO, max_batch_size and GPU groups."""
from __future__ import annotations

from typing import Any

import pytest
from triton_serve.plugin import DataType, ServerError, Status
from triton_serve_tensorrt.autocomplete import batching_hint, complete_config
from triton_serve_tensorrt.engine_description import CONFIG_TYPE_OF_TENSORRT, EngineDescription


def io(tensors) -> list[tuple[str, str, list[int], bool]]:
    return [(t.name, DataType.Name(t.data_type), list(t.dims), t.HasField("reshape")) for t in tensors]


def test_an_empty_config_gets_every_tensor_and_the_profile_batch_limit(kit: Any) -> None:
    config = kit.config()
    complete_config("m", config, kit.linear((1, 4, 8)))
    assert config.max_batch_size == 8
    assert io(config.input) == [("INPUT0", "TYPE_FP32", [4], False)]
    assert io(config.output) == [("OUTPUT0", "TYPE_FP32", [3], False)]
    assert not config.input[0].is_shape_tensor


def test_a_static_engine_does_not_batch(kit: Any) -> None:
    config = kit.config()
    complete_config("m", config, kit.static())
    assert config.max_batch_size == 0
    assert io(config.input) == [("INPUT0", "TYPE_FP32", [2, 4], False)]
    assert io(config.output) == [("OUTPUT0", "TYPE_FP32", [2, 3], False)]


def test_dynamic_inner_dims_stay_variable(kit: Any) -> None:
    engine = EngineDescription((
        kit.tensor("TOKENS", (-1, -1), trt_type="INT32", profiles=(((1, 1), (4, 16), (16, 128)),)),
        kit.tensor("LOGITS", (-1, -1, 10), output=True, trt_type="HALF")))
    config = kit.config()
    complete_config("m", config, engine)
    assert config.max_batch_size == 16
    assert io(config.input) == [("TOKENS", "TYPE_INT32", [-1], False)]
    assert io(config.output) == [("LOGITS", "TYPE_FP16", [-1, 10], False)]


def test_scalar_tensors_become_dims_1_reshaped_to_nothing(kit: Any) -> None:
    batching = EngineDescription((kit.tensor("X", (-1,), trt_type="INT64", profiles=(((1,), (1,), (4,)),)),
                                  kit.tensor("Y", (-1,), output=True, trt_type="INT64")))
    config = kit.config()
    complete_config("m", config, batching)
    assert config.max_batch_size == 4
    assert io(config.input) == [("X", "TYPE_INT64", [1], True)] and list(config.input[0].reshape.shape) == []
    scalar = EngineDescription((kit.tensor("X", (), trt_type="INT32"), kit.tensor("Y", (), output=True,
                                                                                   trt_type="INT32")))
    config = kit.config()
    complete_config("m", config, scalar)
    assert config.max_batch_size == 0
    assert io(config.output) == [("Y", "TYPE_INT32", [1], True)]


def test_listed_tensors_keep_what_they_set_and_unlisted_directions_are_added(kit: Any) -> None:
    config = kit.config('input [ { name: "INPUT0" } ]')
    complete_config("m", config, kit.linear())
    assert io(config.input) == [("INPUT0", "TYPE_FP32", [4], False)]
    assert io(config.output) == [("OUTPUT0", "TYPE_FP32", [3], False)]
    config = kit.config('input [ { name: "INPUT0" dims: [ 2, 2 ] reshape { shape: [ 4 ] } } ]')
    complete_config("m", config, kit.linear())
    assert config.max_batch_size == 8
    assert io(config.input) == [("INPUT0", "TYPE_FP32", [2, 2], True)]


def test_only_listed_tensors_are_completed_when_a_direction_is_listed(kit: Any) -> None:
    engine = EngineDescription((kit.tensor("A", (-1, 2), profiles=(((1, 2), (1, 2), (4, 2)),)),
                                kit.tensor("B", (-1, 2), profiles=(((1, 2), (1, 2), (4, 2)),)),
                                kit.tensor("C", (-1, 2), output=True)))
    config = kit.config('input [ { name: "B" } ]')
    complete_config("m", config, engine)
    assert [t.name for t in config.input] == ["B"]  # validation at load then reports the missing 'A'


def test_a_smaller_max_batch_size_is_kept(kit: Any) -> None:
    config = kit.config("max_batch_size: 4")
    complete_config("m", config, kit.linear((1, 4, 8)))
    assert config.max_batch_size == 4


def test_a_max_batch_size_beyond_the_profiles_is_an_error(kit: Any) -> None:
    with pytest.raises(ServerError) as caught:
        complete_config("m", kit.config("max_batch_size: 16"), kit.linear((1, 4, 8)))
    assert caught.value.message == ("model 'm': max_batch_size is 16, but the engine's optimization profile(s) "
                                    "[0] take batches of at most 8")
    with pytest.raises(ServerError) as caught:
        complete_config("m", kit.config("max_batch_size: 2"), kit.static())
    assert caught.value.message == ("model 'm': max_batch_size is 2, but the engine cannot batch (every IO tensor "
                                    "needs a dynamic first dimension)")


def test_a_max_batch_size_with_full_rank_dims_is_an_error(kit: Any) -> None:
    with pytest.raises(ServerError) as caught:
        complete_config("m", kit.config('max_batch_size: 4 input [ { name: "INPUT0" dims: [ -1, 4 ] } ]'),
                        kit.linear())
    assert caught.value.message == ("model 'm': max_batch_size is 4, but the config's tensor dims are as long as "
                                    "the engine's shapes, leaving no batch dimension")


def test_instance_group_profiles_decide_the_batch_limit(kit: Any) -> None:
    engine = kit.linear((1, 4, 8), (9, 16, 32))
    for profiles, expected in (("", 8), ('profile: ["1"]', 32), ('profile: ["0", "1"]', 32)):
        config = kit.config(f"instance_group [ {{ kind: KIND_GPU {profiles} }} ]")
        complete_config("m", config, engine)
        assert config.max_batch_size == expected, profiles


def test_full_rank_config_dims_mean_no_batching(kit: Any) -> None:
    config = kit.config('input [ { name: "INPUT0" dims: [ -1, 4 ] } ]')
    complete_config("m", config, kit.linear())
    assert config.max_batch_size == 0
    assert io(config.input) == [("INPUT0", "TYPE_FP32", [-1, 4], False)]
    assert io(config.output) == [("OUTPUT0", "TYPE_FP32", [-1, 3], False)]


def test_dims_without_the_batch_dim_on_a_static_engine_are_an_error(kit: Any) -> None:
    with pytest.raises(ServerError, match="leave out a batch dimension, but the engine cannot batch"):
        complete_config("m", kit.config('input [ { name: "INPUT0" dims: [ 4 ] } ]'), kit.static())


def test_contradicting_dims_are_an_error_naming_both_sides(kit: Any) -> None:
    config = kit.config('input [ { name: "INPUT0" dims: [ 4 ] } ] output [ { name: "OUTPUT0" dims: [ -1, 3 ] } ]')
    with pytest.raises(ServerError) as caught:
        batching_hint("m", config, kit.linear())
    assert caught.value.message == ("model 'm': the config's dims contradict each other about batching: "
                                    "['INPUT0'] leave out a batch dimension, ['OUTPUT0'] do not")


def test_a_name_the_engine_lacks_is_an_error_listing_its_tensors(kit: Any) -> None:
    with pytest.raises(ServerError) as caught:
        complete_config("m", kit.config('input [ { name: "IMAGE" } ]'), kit.linear())
    assert caught.value.message == ("model 'm': config input 'IMAGE' is not an input of the engine; "
                                    "its inputs are ['INPUT0']")
    with pytest.raises(ServerError, match="config output 'INPUT0' is not an output of the engine"):
        complete_config("m", kit.config('output [ { name: "INPUT0" } ]'), kit.linear())


@pytest.mark.parametrize(("trt_type", "config_type"), sorted(CONFIG_TYPE_OF_TENSORRT.items()))
def test_tensorrt_types_map_to_triton_types(kit: Any, trt_type: str, config_type: str) -> None:
    engine = EngineDescription((kit.tensor("X", (3,), trt_type=trt_type), kit.tensor("Y", (3,), output=True,
                                                                                      trt_type=trt_type)))
    config = kit.config()
    complete_config("m", config, engine)
    assert DataType.Name(config.input[0].data_type) == config_type == DataType.Name(config.output[0].data_type)


def test_the_type_table_covers_every_numeric_triton_type_tensorrt_has() -> None:
    assert sorted(CONFIG_TYPE_OF_TENSORRT.values()) == sorted(
        ["TYPE_FP32", "TYPE_FP16", "TYPE_BF16", "TYPE_INT8", "TYPE_INT32", "TYPE_INT64", "TYPE_BOOL", "TYPE_UINT8"])


@pytest.mark.parametrize("trt_type", ["FP8", "INT4", "FP4"])
def test_types_triton_cannot_carry_are_unsupported(kit: Any, trt_type: str) -> None:
    engine = EngineDescription((kit.tensor("X", (3,)), kit.tensor("Q", (3,), output=True, trt_type=trt_type)))
    with pytest.raises(ServerError) as caught:
        complete_config("quant", kit.config(), engine)
    assert caught.value.status is Status.UNSUPPORTED
    assert caught.value.message == (f"model 'quant': engine output 'Q' has TensorRT type {trt_type}, "
                                    "which no Triton datatype carries")


def test_a_config_marking_an_execution_tensor_as_shape_tensor_is_an_error(kit: Any) -> None:
    with pytest.raises(ServerError, match="'INPUT0' is marked is_shape_tensor in the config"):
        complete_config("m", kit.config('input [ { name: "INPUT0" is_shape_tensor: true } ]'), kit.linear())


def test_shape_tensors_are_described_as_such(kit: Any) -> None:
    engine = EngineDescription((kit.tensor("X", (3,)), kit.tensor("SHAPE", (2,), trt_type="INT32", shape_tensor=True),
                                kit.tensor("Y", (3,), output=True)))
    config = kit.config()
    complete_config("m", config, engine)
    assert [(t.name, t.is_shape_tensor, list(t.dims)) for t in config.input] == [("X", False, [3]),
                                                                               ("SHAPE", True, [2])]
