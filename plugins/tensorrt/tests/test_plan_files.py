"""Which plan file a model version loads: cc_model_filenames, default_model_filename, model.plan."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from triton_serve.plugin import ModelSpec, ServerError
from triton_serve_tensorrt.plan_files import plan_filename, plan_path


def test_the_default_is_model_plan(kit: Any) -> None:
    assert plan_filename(kit.config(), "8.0") == "model.plan"


def test_default_model_filename_overrides_the_default(kit: Any) -> None:
    assert plan_filename(kit.config('default_model_filename: "resnet.engine"'), "8.0") == "resnet.engine"


def test_a_compute_capability_entry_wins_for_that_gpu_only(kit: Any) -> None:
    config = kit.config('default_model_filename: "any.plan" '
                        'cc_model_filenames [ { key: "8.0" value: "a100.plan" }, { key: "9.0" value: "h100.plan" } ]')
    assert plan_filename(config, "9.0") == "h100.plan"
    assert plan_filename(config, "8.0") == "a100.plan"
    assert plan_filename(config, "8.6") == "any.plan"


def test_a_missing_plan_file_names_model_version_and_file(kit: Any, tmp_path: Path) -> None:
    (tmp_path / "resnet" / "3").mkdir(parents=True)
    spec = ModelSpec("resnet", 3, kit.config(name="resnet"), tmp_path / "resnet", tmp_path / "resnet" / "3",
                     "model.plan")
    with pytest.raises(ServerError) as caught:
        plan_path(spec, 0)
    assert caught.value.message.startswith("model 'resnet' version 3: plan file 'model.plan' does not exist")
    (tmp_path / "resnet" / "3" / "model.plan").write_bytes(b"\0")
    assert plan_path(spec, 0) == tmp_path / "resnet" / "3" / "model.plan"
