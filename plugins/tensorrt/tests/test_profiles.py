"""Optimization-profile rules: which profiles an instance uses, their batch limits, and which one a batch gets."""
from __future__ import annotations

from typing import Any

import pytest
from triton_serve.plugin import ModelInstanceGroup, ServerError
from triton_serve_tensorrt.engine_description import EngineDescription
from triton_serve_tensorrt.profiles import (
    max_batch_size,
    model_profile_indices,
    profile_indices,
    profile_max_batch_size,
    select_profile,
)


def group(*profiles: str, name: str = "g") -> ModelInstanceGroup:
    return ModelInstanceGroup(name=name, profile=list(profiles))


def test_no_profile_list_means_profile_0_only() -> None:
    assert profile_indices(group(), 3, "m") == [0]


def test_profile_list_is_deduplicated_and_ascending() -> None:
    assert profile_indices(group("2", "0", "2"), 3, "m") == [0, 2]


@pytest.mark.parametrize("name", ["3", "-1", "first", ""])
def test_a_profile_the_engine_lacks_is_an_error_naming_model_and_group(name: str) -> None:
    with pytest.raises(ServerError) as caught:
        profile_indices(group(name, name="gpu_group"), 3, "resnet")
    message = caught.value.message
    assert "model 'resnet'" in message and "instance_group 'gpu_group'" in message
    assert f"profile '{name}'" in message and "numbered 0 to 2" in message


def test_model_profiles_are_the_union_over_groups(kit: Any) -> None:
    config = kit.config('instance_group [ { profile: ["1"] }, { profile: ["2", "1"] } ]')
    assert model_profile_indices(config, 3, "m") == [1, 2]
    assert model_profile_indices(kit.config(), 3, "m") == [0]


def test_profile_batch_limit_is_the_smallest_input_maximum(kit: Any) -> None:
    engine = EngineDescription((
        kit.tensor("A", (-1, 2), profiles=(((1, 2), (2, 2), (8, 2)), ((1, 2), (2, 2), (64, 2)))),
        kit.tensor("B", (-1,), profiles=(((1,), (2,), (6,)), ((1,), (2,), (32,)))),
        kit.tensor("C", (-1, 2), output=True)), 2)
    assert profile_max_batch_size(engine, 0) == 6
    assert profile_max_batch_size(engine, 1) == 32


def test_max_batch_size_is_the_largest_over_allowed_profiles(kit: Any) -> None:
    engine = kit.linear((1, 4, 8), (9, 16, 32))
    assert max_batch_size(engine, [0]) == 8
    assert max_batch_size(engine, [1]) == 32
    assert max_batch_size(engine, [0, 1]) == 32


def test_an_engine_without_dynamic_first_dims_has_no_batch_limit(kit: Any) -> None:
    assert max_batch_size(kit.static(), [0]) == 0
    half_dynamic = EngineDescription((kit.tensor("X", (-1, 4), profiles=(((1, 4), (1, 4), (8, 4)),)),
                                      kit.tensor("Y", (1, 4), output=True)))
    assert max_batch_size(half_dynamic, [0]) == 0


def test_the_fitting_profile_is_chosen(kit: Any) -> None:
    engine = kit.linear((1, 4, 8), (9, 16, 32))
    assert select_profile("m", engine, [0, 1], {"INPUT0": (4, 4)}) == 0
    assert select_profile("m", engine, [0, 1], {"INPUT0": (20, 4)}) == 1
    assert select_profile("m", engine, [1], {"INPUT0": (9, 4)}) == 1


def test_among_fitting_profiles_the_one_nearest_its_optimum_wins(kit: Any) -> None:
    engine = kit.linear((1, 1, 16), (1, 8, 16))
    assert select_profile("m", engine, [0, 1], {"INPUT0": (2, 4)}) == 0
    assert select_profile("m", engine, [0, 1], {"INPUT0": (7, 4)}) == 1


def test_on_a_tie_the_lowest_profile_wins(kit: Any) -> None:
    engine = kit.linear((1, 4, 8), (1, 4, 8), (1, 4, 8))
    assert select_profile("m", engine, [1, 2], {"INPUT0": (3, 4)}) == 1


def test_no_fitting_profile_is_an_error_listing_every_range(kit: Any) -> None:
    engine = kit.linear((1, 4, 8), (9, 16, 32))
    with pytest.raises(ServerError) as caught:
        select_profile("linear", engine, [0, 1], {"INPUT0": (40, 4)})
    message = caught.value.message
    assert message.startswith("model 'linear': no optimization profile among [0, 1] accepts")
    assert "'INPUT0' [40, 4]" in message
    assert "profile 0 takes 'INPUT0' from [1, 4] to [8, 4]" in message
    assert "profile 1 takes 'INPUT0' from [9, 4] to [32, 4]" in message


def test_a_profile_outside_the_instance_restriction_is_never_chosen(kit: Any) -> None:
    engine = kit.linear((1, 4, 8), (9, 16, 32))
    with pytest.raises(ServerError, match="among \\[1\\]"):
        select_profile("m", engine, [1], {"INPUT0": (4, 4)})


def test_every_dimension_must_fit_not_only_the_batch(kit: Any) -> None:
    engine = EngineDescription((
        kit.tensor("TOKENS", (-1, -1), trt_type="INT32", profiles=(((1, 1), (4, 16), (8, 32)),)),
        kit.tensor("MASK", (-1, -1), trt_type="BOOL", profiles=(((1, 1), (4, 16), (8, 32)),)),
        kit.tensor("LOGITS", (-1, -1), output=True)))
    assert select_profile("m", engine, [0], {"TOKENS": (2, 32), "MASK": (2, 32)}) == 0
    with pytest.raises(ServerError, match="'TOKENS' \\[2, 33\\]"):
        select_profile("m", engine, [0], {"TOKENS": (2, 33), "MASK": (2, 33)})
    with pytest.raises(ServerError, match="no optimization profile"):
        select_profile("m", engine, [0], {"TOKENS": (2, 4, 1), "MASK": (2, 4)})


def test_a_batch_missing_an_engine_input_is_an_error(kit: Any) -> None:
    with pytest.raises(ServerError, match="model 'm': the batch has no value for engine input\\(s\\) \\['INPUT0'\\]"):
        select_profile("m", kit.linear(), [0], {"OTHER": (1, 4)})
