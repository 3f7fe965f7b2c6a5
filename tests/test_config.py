"""config.pbtxt parsing, Triton's defaults and validation rules, auto-complete, and the JSON shape."""
from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.utils import InferenceServerException

from triton_serve._engine.config import apply_defaults, config_to_json, read_config
from triton_serve._engine.config_validation import validate_config
from triton_serve._engine.errors import ServerError
from triton_serve._engine.protos.model_config_pb2 import ModelConfig

from .conftest import ADD_SUB


def parsed(text: str, name: str = "m") -> ModelConfig:
    config = text_format.Parse(text, ModelConfig())
    apply_defaults(config, name)
    return config


def test_read_config_reports_parse_errors_with_the_model(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text('name: "m"\nmax_batch_size: "eight"')
    with pytest.raises(ServerError, match=r"failed to parse model config for 'm' \(config.pbtxt\).*max_batch_size"):
        read_config(tmp_path, "m")


def test_custom_config_name_is_preferred(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text("max_batch_size: 1")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "big.pbtxt").write_text("max_batch_size: 64")
    assert read_config(tmp_path, "m", "big").max_batch_size == 64
    assert read_config(tmp_path, "m", "absent").max_batch_size == 1


def test_defaults_follow_triton() -> None:
    config = parsed('backend: "x"')
    assert config.name == "m"
    assert config.version_policy.latest.num_versions == 1
    assert [(g.name, g.count, g.kind) for g in config.instance_group] == [("m_0", 1, 2)]  # KIND_CPU


def test_config_name_must_match_directory() -> None:
    with pytest.raises(ServerError, match="unexpected directory name 'm' for model 'other', directory name must "
                                          "equal model name"):
        parsed('name: "other" backend: "x"')


# Each row: a config snippet (backend "x" is added unless the row is about backend or platform)
# and Triton 2.51's message for it (model_config_utils.cc), for a model named "my_model".
INVALID = [
    # ValidateModelConfig
    ('platform: "unknown_platform"', "unexpected platform type 'unknown_platform' for my_model"),
    ('platform: "ensemble" backend: "python"',
     "Ensemble model 'my_model' must have platform type 'ensemble' and empty backend type"),
    ('platform: "onnxruntime_onnx" backend: "pytorch"',
     "unexpected 'platform' and 'backend' pair, got:onnxruntime_onnx, pytorch"),
    ("max_batch_size: -1", "'max_batch_size' must be non-negative value for my_model"),
    ("max_batch_size: 4 dynamic_batching { preferred_batch_size: [0] }",
     "dynamic batching preferred size must be positive for my_model"),
    ("max_batch_size: 4 dynamic_batching { preferred_batch_size: [8] }",
     "dynamic batching preferred size must be <= max batch size for my_model"),
    ("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
     "default priority level must be in range [1, 2] for my_model"),
    ("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 1 "
     "priority_queue_policy { key: 5 value { } } }",
     "priority queue policy must have priority level in range [1, 2] for my_model"),
    ("max_batch_size: 4 dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
     "Only one priority level is allowed when 'preserve_ordering' is true for my_model"),
    ("max_batch_size: 4 dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY "
     "default_timeout_microseconds: 10 } }",
     "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for my_model"),
    ("sequence_batching { } response_cache { enable: true }",
     "Response Cache does not currently support model my_model with sequence batching scheduler. Please disable "
     "the response cache."),
    ('sequence_batching { control_input { control { kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] } } }',
     "sequence batching control tensor must have a name for my_model"),
    ('sequence_batching { control_input { name: "S" control { kind: CONTROL_SEQUENCE_START '
     'int32_false_true: [0, 1] } } control_input { name: "S" control { kind: CONTROL_SEQUENCE_END '
     'int32_false_true: [0, 1] } } }',
     "sequence batching control tensor 'S' is specified for multiple control kinds for my_model"),
    ('sequence_batching { control_input { name: "S" control { kind: CONTROL_SEQUENCE_START '
     'int32_false_true: [0, 1] } } control_input { name: "T" control { kind: CONTROL_SEQUENCE_START '
     'int32_false_true: [0, 1] } } }',
     "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for my_model"),
    ('sequence_batching { control_input { name: "S" control { kind: CONTROL_SEQUENCE_START } } }',
     "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
     "CONTROL_SEQUENCE_START for my_model"),
    ('sequence_batching { control_input { name: "E" control { kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1] '
     'fp32_false_true: [0, 1] } } }',
     "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and 'bool_false_true' "
     "for CONTROL_SEQUENCE_END for my_model"),
    ('sequence_batching { control_input { name: "R" control { kind: CONTROL_SEQUENCE_READY int32_false_true: [1] } } }',
     "sequence batching control 'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_READY for "
     "my_model"),
    ('sequence_batching { control_input { name: "R" control { kind: CONTROL_SEQUENCE_READY fp32_false_true: [1] } } }',
     "sequence batching control 'fp32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_READY for "
     "my_model"),
    ('sequence_batching { control_input { name: "R" control { kind: CONTROL_SEQUENCE_READY bool_false_true: [true] '
     '} } }',
     "sequence batching control 'bool_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_READY for "
     "my_model"),
    ('sequence_batching { control_input { name: "C" control { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 '
     'int32_false_true: [0, 1] } } }',
     "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
     "CONTROL_SEQUENCE_CORRID for my_model"),
    ('sequence_batching { control_input { name: "C" control { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 }'
     " } }", "unexpected data type for control CONTROL_SEQUENCE_CORRID for my_model. Allowed data types are "
     "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"),
    ("max_batch_size: 4 sequence_batching { oldest { preferred_batch_size: [0] } }",
     "sequence batching preferred batch size must be positive for my_model"),
    ("max_batch_size: 4 sequence_batching { oldest { preferred_batch_size: [8] } }",
     "sequence batching preferred batch size must be <= max batch size for my_model"),
    ("sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
     "sequence batching minimum slot utilization must be in range (0.0, 1.0] for my_model"),
    ('platform: "ensemble"', "ensemble scheduling must be set for ensemble my_model whose platform is ensemble"),
    ("model_transaction_policy { decoupled: true } response_cache { enable: true }",
     "Response Cache does not currently support model my_model with 'decoupled' transaction policy. Please "
     "disable the response cache."),
    ("model_metrics { metric_control { } }", "metric control must specify 'metric_identifier'"),
    ("model_metrics { metric_control { metric_identifier { } } }",
     "metric identifier must specify non-empty 'family'"),
    ('model_metrics { metric_control { metric_identifier { family: "f" } } }',
     "metric control must specify 'histogram_options'"),
    ('model_metrics { metric_control { metric_identifier { family: "f" } histogram_options { } } }',
     "histogram options must specify non-empty 'buckets'"),
    # ValidateInstanceGroup
    ("instance_group { kind: KIND_CPU gpus: [0] }",
     "instance group my_model_0 of model my_model has kind KIND_CPU but specifies one or more GPUs"),
    ("instance_group { kind: KIND_MODEL gpus: [0] }",
     "instance group my_model_0 of model my_model has kind KIND_MODEL but specifies one or more GPUs"),
    ('instance_group { kind: KIND_CPU profile: ["0"] }',
     "instance group my_model_0 of model my_model and platform specifies profile field which is only supported "
     "for TensorRT models"),
    # ValidateModelIOConfig
    ('input { data_type: TYPE_FP32 dims: [1] }', "model input must specify 'name' for my_model"),
    ('input { name: "A" dims: [1] }', "model input 'A' must specify 'data_type' for my_model"),
    ('max_batch_size: 4 input { name: "A" data_type: TYPE_FP32 }', "model input 'A' must specify 'dims' for my_model"),
    ('input { name: "A" data_type: TYPE_FP32 dims: [1] reshape { shape: [] } }',
     "model input 'A' cannot have empty reshape for non-batching model as scalar tensors are not supported for "
     "my_model"),
    ('input { name: "A" data_type: TYPE_FP32 dims: [0] }',
     "model input 'A' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for my_model"),
    ('input { name: "A" data_type: TYPE_FP32 dims: [2] reshape { shape: [0] } }',
     "model input 'A' reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension for "
     "my_model"),
    ('input { name: "A" data_type: TYPE_FP32 dims: [2, 3] reshape { shape: [5] } }',
     "model input 'A' has different size for dims and reshape for my_model"),
    ('input { name: "A" data_type: TYPE_FP32 dims: [2, -1, -1] reshape { shape: [2, -1] } }',
     "model input 'A' has different number of variable-size dimensions for dims and reshape for my_model"),
    ('input { name: "A" data_type: TYPE_FP32 dims: [2, -1, 6] reshape { shape: [4, -1, 3] } }',
     "model input 'A' has different size for dims and reshape for my_model"),
    ('input { name: "A" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [2, 3] }',
     "model input NHWC/NCHW require 3 dims for my_model"),
    ('input { name: "A" data_type: TYPE_INT32 dims: [1] is_shape_tensor: true }',
     "shape tensors are only supported for TensorRT platform for my_model"),
    ('input { name: "A" data_type: TYPE_FP32 dims: [1, 2, 3] is_non_linear_format_io: true }',
     "Non-linear IO format is only supported for the TensorRT platform for my_model"),
    ('output { data_type: TYPE_FP32 dims: [1] }', "model output must specify 'name' for my_model"),
    ('output { name: "B" data_type: TYPE_FP32 dims: [-2] }',
     "model output 'B' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for my_model"),
    ('output { name: "B" data_type: TYPE_INT32 dims: [1] is_shape_tensor: true }',
     "shape tensors are only supported for TensorRT platform for my_model"),
    ('max_batch_size: 4 input { name: "A" data_type: TYPE_FP32 dims: [1] } '
     'batch_input { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_FP32 }',
     "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for my_model"),
    ('max_batch_size: 4 input { name: "A" data_type: TYPE_FP32 dims: [1] } '
     'batch_input { kind: BATCH_ITEM_SHAPE target_name: "N" data_type: TYPE_INT64 source_input: "A" }',
     "batch input data type must be TYPE_INT32 or TYPE_FP32 for my_model"),
    ('max_batch_size: 4 input { name: "A" data_type: TYPE_FP32 dims: [1] } '
     'batch_input { kind: BATCH_ITEM_SHAPE target_name: "N" data_type: TYPE_INT32 source_input: "Z" }',
     "unknown source input name 'Z' for my_model"),
    ('max_batch_size: 4 input { name: "A" data_type: TYPE_FP32 dims: [1] } '
     'batch_output { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "B" }',
     "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0 for my_model"),
    ('max_batch_size: 4 input { name: "A" data_type: TYPE_FP32 dims: [1] } '
     'batch_output { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "B" source_input: "Z" }',
     "unknown source input name 'Z' for my_model"),
    ('max_batch_size: 4 input { name: "A" data_type: TYPE_FP32 dims: [1] } '
     'batch_output { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "Q" source_input: "A" }',
     "unknown target output name 'Q' for my_model"),
    ('max_batch_size: 4 input { name: "A" data_type: TYPE_FP32 dims: [1] } '
     'output { name: "B" data_type: TYPE_FP32 dims: [1] } '
     'batch_output { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: ["B", "B"] source_input: "A" }',
     "target output name 'B' can only be specified once for my_model"),
    # beyond Triton (it would fail later, or never)
    ('input { name: "A" data_type: TYPE_FP32 dims: [1] } input { name: "A" data_type: TYPE_FP32 dims: [1] }',
     "model input 'A' is declared more than once for my_model"),
    ('output { name: "B" data_type: TYPE_FP32 dims: [1] label_filename: "missing.txt" }',
     "label file 'missing.txt' of model output 'B' does not exist for my_model"),
    ("version_policy { latest { num_versions: 0 } }", "version_policy latest num_versions must be >= 1"),
    ("version_policy { specific { } }", "version_policy specific versions must list versions >= 1"),
    ('instance_group { rate_limiter { resources { count: 1 } } }',
     "instance group my_model_0 of model my_model has a rate limiter resource without a name"),
]


@pytest.mark.parametrize(("text", "message"), INVALID, ids=[m[:60] for _, m in INVALID])
def test_invalid_configs_get_tritons_message(text: str, message: str, tmp_path: Path) -> None:
    backend = "" if "platform" in text or "backend" in text else 'backend: "x"\n'
    config = parsed(backend + text, name="my_model")
    with pytest.raises(ServerError) as error:
        validate_config(config, tmp_path)
    assert error.value.message == message or error.value.message.startswith(message)
    assert error.value.status.http_status == 400


def test_valid_config_passes(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("a\nb\n")
    validate_config(parsed(ADD_SUB + """
        output { name: "P" data_type: TYPE_FP32 dims: [2] label_filename: "labels.txt" }
        instance_group [ { count: 2 kind: KIND_CPU } ]
        dynamic_batching { preferred_batch_size: [4, 8] max_queue_delay_microseconds: 100
                           priority_levels: 2 default_priority_level: 2
                           priority_queue_policy { key: 1 value { max_queue_size: 3 } } }
    """), tmp_path)


def test_json_shape_matches_triton() -> None:
    config = parsed(ADD_SUB + """
        dynamic_batching { max_queue_delay_microseconds: 250 priority_levels: 2 default_priority_level: 1
                           priority_queue_policy { key: 1 value { default_timeout_microseconds: 9 } } }
    """)
    data = config_to_json(config)
    assert data["max_batch_size"] == 8
    assert data["input"][0]["dims"] == [16]  # int64 as JSON numbers, not strings
    assert data["input"][0]["data_type"] == "TYPE_INT32"
    assert data["input"][0]["optional"] is False  # defaults are printed
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 250
    assert data["dynamic_batching"]["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 9
    assert data["instance_group"][0]["kind"] == "KIND_CPU"


AUTO = 'max_batch_size: 4\ninput { name: "INPUT0" data_type: TYPE_FP32 dims: [3] }\n' \
       'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [3] }\n'


def test_auto_complete_fills_inputs_outputs_and_backend(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("auto", None, files={"1/toy_identity.toy": AUTO})
    client = httpclient.InferenceServerClient(toy_server().http_url)
    config = client.get_model_config("auto")
    assert config["backend"] == "toy_identity"
    assert config["max_batch_size"] == 4
    assert [i["name"] for i in config["input"]] == ["INPUT0"]
    assert client.get_model_metadata("auto")["inputs"][0]["shape"] == [-1, 3]


@pytest.mark.parametrize("flag", ["strict_model_config", "disable_auto_complete_config"])
def test_auto_complete_can_be_turned_off(flag: str, add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("named", 'backend: "toy_identity"\nmax_batch_size: 1', files={"1/toy_identity.toy": AUTO})
    add_model("unnamed", None, files={"1/toy_identity.toy": AUTO})
    client = httpclient.InferenceServerClient(toy_server(**{flag: True}).http_url)
    assert client.get_model_config("named")["input"] == []  # the model file was not read
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert "must specify 'platform' or 'backend'" in index["unnamed"]["reason"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_invalid_config_reaches_the_client_with_tritons_message(protocol: str, add_model,
                                                                   toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("bad", 'backend: "toy_identity"\nmax_batch_size: 4\ndynamic_batching { preferred_batch_size: [8] }\n'
                     'input { name: "INPUT0" data_type: TYPE_FP32 dims: [1] }\n'
                     'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }')
    server = toy_server(model_control_mode="explicit")
    client = (httpclient.InferenceServerClient(server.http_url) if protocol == "http"
              else grpcclient.InferenceServerClient(server.grpc_url))
    expected = ("failed to load 'bad', failed to poll from model repository: dynamic batching preferred size must "
                "be <= max batch size for bad")
    with pytest.raises(InferenceServerException) as error:
        client.load_model("bad")
    assert expected in error.value.message()
    assert error.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    index = client.get_model_repository_index()
    entries = index if protocol == "http" else [{"state": m.state, "reason": m.reason} for m in index.models]
    assert entries[0]["state"] == "UNAVAILABLE" and expected in entries[0]["reason"]


def test_every_invalid_config_fails_an_explicit_load_with_tritons_message(repo, toy_server) -> None:  # type: ignore[no-untyped-def]
    """The INVALID table again, end to end: one model per row, each loaded through tritonclient.
    Rows about platform and backend pairs stay unit-level (the toy backends answer to neither)."""
    rows = {f"row{i:02d}": (text, message) for i, (text, message) in enumerate(INVALID)
            if "platform" not in text and "backend" not in text}
    for name, (text, _) in rows.items():
        model_dir = repo / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text('backend: "toy_identity"\n' + text)
    client = httpclient.InferenceServerClient(toy_server(model_control_mode="explicit").http_url)
    for name, (_, message) in rows.items():
        with pytest.raises(InferenceServerException) as error:
            client.load_model(name)
        expected = message.replace("my_model", name)
        assert f"failed to load '{name}', failed to poll from model repository: {expected}" in error.value.message(), \
            name


def test_the_backend_is_guessed_from_the_version_the_policy_selects(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("pinned", "version_policy { specific { versions: [1] } }", versions=(1, 2),
              files={"1/toy_identity.toy": AUTO})  # version 2 has no model file
    client = httpclient.InferenceServerClient(toy_server().http_url)
    assert client.is_model_ready("pinned", "1")
    assert client.get_model_config("pinned")["backend"] == "toy_identity"


def test_the_log_has_tritons_poll_failure_line(add_model, toy_server, caplog) -> None:  # type: ignore[no-untyped-def]
    add_model("bad", 'backend: "toy_identity"\nmax_batch_size: -1')
    toy_server()
    assert ("Poll failed for model directory 'bad': 'max_batch_size' must be non-negative value for bad"
            in caplog.text)
