"""Triton's OpenVINO parameters: parsing, and what each one changes in the compiled model or in execution."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import pytest
from google.protobuf import text_format

from triton_serve.plugin import AutoCompleteOptions, ModelConfig, ModelSpec, ServerError, model_parameters
from triton_serve_openvino.backend import OpenVinoBackend
from triton_serve_openvino.parameters import OpenVinoParameters

MLP = """
    backend: "openvino"
    max_batch_size: 4
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [4] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [3] }]
"""


def parameters(**values: str) -> str:
    return "".join(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
                   for key, value in values.items())


def parse(**values: str) -> OpenVinoParameters:
    config = text_format.Parse(parameters(**values), ModelConfig())
    parsed: OpenVinoParameters = model_parameters(OpenVinoBackend(), ModelSpec("m", 1, config, Path("m"), Path("m/1")))
    return parsed


@pytest.fixture
def mlp_dir(repo: Path, models: dict[str, Path], kit: Any) -> Path:
    return kit.write_model(repo, "mlp", {"model.xml": models["mlp_xml"],
                                         "model.bin": models["mlp_xml"].with_suffix(".bin")})


def test_triton_spellings_are_accepted_in_any_case() -> None:
    parsed = parse(PERFORMANCE_HINT="throughput", NUM_STREAMS="auto", INFERENCE_NUM_THREADS="2", HINT_BF16="no",
                   SKIP_OV_DYNAMIC_BATCHSIZE="yes", ENABLE_BATCH_PADDING="Yes", RESHAPE_IO_LAYERS="NO",
                   SOMETHING_ELSE="is left alone")
    assert parsed.compile_properties == {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": "AUTO",
                                         "INFERENCE_NUM_THREADS": "2", "INFERENCE_PRECISION_HINT": "f32"}
    assert (parsed.skip_dynamic_batch, parsed.enable_batch_padding, parsed.reshape_io_layers) == (True, True, False)
    assert parse() == OpenVinoParameters()
    assert parse(NUM_STREAMS="3", HINT_BF16="YES").compile_properties == {"NUM_STREAMS": "3",
                                                                          "INFERENCE_PRECISION_HINT": "bf16"}


@pytest.mark.parametrize("key, value, accepted", [
    ("PERFORMANCE_HINT", "FAST", "one of LATENCY, THROUGHPUT, CUMULATIVE_THROUGHPUT"),
    ("NUM_STREAMS", "1.5", "AUTO, NUMA or an integer >= 0"),
    ("INFERENCE_NUM_THREADS", "all", "an integer >= 0"),
    ("COMPILATION_NUM_THREADS", "-1", "an integer >= 0"),
    ("HINT_BF16", "maybe", "one of YES, NO"),
    ("ENABLE_BATCH_PADDING", "1", "one of YES, NO"),
    ("RESHAPE_IO_LAYERS", "true", "one of YES, NO"),
])
def test_a_bad_value_names_the_parameter_and_what_it_accepts(key: str, value: str, accepted: str) -> None:
    with pytest.raises(ServerError) as caught:
        parse(**{key: value})
    assert caught.value.message == (f"backend 'openvino': model 'm' parameter '{key}' has invalid value '{value}': "
                                    f"expected {accepted}")


def test_compile_properties_reach_the_compiled_model(mlp_dir: Path, kit: Any) -> None:
    spec = kit.spec(mlp_dir, MLP + parameters(NUM_STREAMS="1", PERFORMANCE_HINT="THROUGHPUT", HINT_BF16="NO"))
    compiled = kit.loaded_instance(spec).compiled
    assert compiled.get_property("NUM_STREAMS") == 1
    assert compiled.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32


def test_default_max_batch_size_option(mlp_dir: Path, kit: Any) -> None:
    spec = kit.spec(mlp_dir, 'backend: "openvino"', OpenVinoBackend(AutoCompleteOptions(default_max_batch_size=16)))
    assert spec.config.max_batch_size == 16


def test_skip_dynamic_batch_fixes_the_batch_and_padding_fills_it(mlp_dir: Path, models: dict[str, Path],
                                                                 kit: Any) -> None:
    spec = kit.spec(mlp_dir, MLP + parameters(SKIP_OV_DYNAMIC_BATCHSIZE="YES", ENABLE_BATCH_PADDING="YES"))
    instance = kit.loaded_instance(spec)
    assert instance.compiled.input("INPUT0").get_partial_shape() == ov.PartialShape([4, 4])
    rng = np.random.default_rng(5)
    batches = [{"INPUT0": rng.normal(size=(n, 4)).astype(np.float32)} for n in (1, 2)]
    responses = kit.execute(instance, batches)
    for batch, response in zip(batches, responses, strict=True):
        expected = kit.reference(models["mlp_xml"], batch)["OUTPUT0"]
        np.testing.assert_allclose(response.output("OUTPUT0").data, expected, rtol=1e-5, atol=1e-6)


def test_skip_dynamic_batch_without_padding_takes_only_full_batches(mlp_dir: Path, kit: Any) -> None:
    instance = kit.loaded_instance(kit.spec(mlp_dir, MLP + parameters(SKIP_OV_DYNAMIC_BATCHSIZE="YES")))
    full = kit.execute(instance, [{"INPUT0": np.ones((4, 4), np.float32)}])
    assert full[0].output("OUTPUT0").data.shape == (4, 3)
    with pytest.raises(ServerError, match=r"fixed batch size of 4 \(SKIP_OV_DYNAMIC_BATCHSIZE\), got a batch of 3; "
                                          "send batches of 4 or set the parameter ENABLE_BATCH_PADDING to YES"):
        kit.execute(instance, [{"INPUT0": np.ones((3, 4), np.float32)}])


def test_reshape_io_layers_makes_fixed_dimensions_variable(repo: Path, models: dict[str, Path], kit: Any) -> None:
    model_dir = kit.write_model(repo, "ints", {"model.xml": models["ints_xml"],
                                               "model.bin": models["ints_xml"].with_suffix(".bin")})
    config = """
        backend: "openvino"
        input [{ name: "A", data_type: TYPE_INT32, dims: [-1, -1] },
               { name: "B", data_type: TYPE_INT32, dims: [-1, -1] },
               { name: "H", data_type: TYPE_FP16, dims: [-1, -1] }]
    """
    with pytest.raises(ServerError, match="dimension 1 is -1 \\(variable\\) in the config but fixed at 3"):
        kit.loaded_instance(kit.spec(model_dir, config))
    instance = kit.loaded_instance(kit.spec(model_dir, config + parameters(RESHAPE_IO_LAYERS="YES")))
    rng = np.random.default_rng(6)
    arrays = {"A": rng.integers(-50, 50, (2, 5), dtype=np.int32), "B": rng.integers(-50, 50, (2, 5), dtype=np.int32),
              "H": rng.normal(size=(2, 5)).astype(np.float16)}
    [response] = kit.execute(instance, [arrays])
    expected = kit.reference(models["ints_xml"], arrays, reshape={name: [-1, -1] for name in arrays})
    for name in ("SUM", "GREATER", "WIDE", "HALF"):
        np.testing.assert_array_equal(response.output(name).data, expected[name], err_msg=name)
    np.testing.assert_array_equal(response.output("SUM").data, arrays["A"] + arrays["B"])


def test_a_config_data_type_other_than_the_models_is_converted(mlp_dir: Path, models: dict[str, Path],
                                                               kit: Any) -> None:
    spec = kit.spec(mlp_dir, MLP.replace("TYPE_FP32", "TYPE_FP64") + parameters(HINT_BF16="NO"))
    instance = kit.loaded_instance(spec)
    x = np.random.default_rng(7).normal(size=(2, 4))
    [response] = kit.execute(instance, [{"INPUT0": x}])
    got = response.output("OUTPUT0")
    assert got.datatype == "FP64" and got.data.dtype == np.float64
    expected = kit.reference(models["mlp_xml"], {"INPUT0": x.astype(np.float32)},
                             properties={"INFERENCE_PRECISION_HINT": "f32"})["OUTPUT0"]
    np.testing.assert_allclose(got.data, expected, rtol=1e-5, atol=1e-6)
