"""Triton's naming conventions, rule by rule."""
from __future__ import annotations

import pytest

from triton_serve.plugin import ServerError
from triton_serve_torch.naming import bind_inputs, bind_outputs, named_index


def test_named_index_splits_at_the_first_double_underscore():
    assert named_index("INPUT__0") == 0
    assert named_index("__12") == 12
    assert named_index("a__b__1") is None  # Triton reads "b__1" as the index: not a number
    assert named_index("INPUT_0") is None
    assert named_index("INPUT__") is None


def test_argument_names_win_over_indices():
    # "x__1" is both an argument name and <name>__<index>: argument names are tried first
    assert bind_inputs("m", ["x__1", "y"], ["y", "x__1"]) == {"x__1": 1, "y": 0}


def test_indices_bind_inputs_by_position():
    assert bind_inputs("m", ["B__1", "A__0"], ["x", "y"]) == {"B__1": 1, "A__0": 0}


def test_duplicate_indices_are_an_error():
    with pytest.raises(ServerError, match="inputs 'A__0' and 'B__0' both name index 0"):
        bind_inputs("m", ["A__0", "B__0"], ["x", "y"])


def test_outputs_fall_back_to_config_order_when_the_count_is_unknown():
    assert bind_outputs("m", ["scores", "labels"], None) == {"scores": 0, "labels": 1}
    assert bind_outputs("m", ["OUT__3"], None) == {"OUT__3": 3}  # checked once forward has run
    with pytest.raises(ServerError, match="lists 3 outputs"):
        bind_outputs("m", ["a", "b", "c"], 2)
