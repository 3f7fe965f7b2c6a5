"""config.pbtxt parsing, Triton's defaults and validation rules, auto-complete, and the JSON shape."""
from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format

from triton_serve.config import apply_defaults, config_to_json, read_config
from triton_serve.config_validation import validate_config
from triton_serve.errors import ServerError
from triton_serve.protos.model_config_pb2 import ModelConfig

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
    with pytest.raises(ServerError, match="name: 'other' does not match the model directory 'm'"):
        parsed('name: "other" backend: "x"')


INVALID = [
    ("max_batch_size: -1", "max_batch_size: must be >= 0"),
    ("max_batch_size: 0", "backend: must specify 'platform' or 'backend'"),
    ('input { name: "A" data_type: TYPE_FP32 dims: [0] }', "input 'A'.dims: each dim must be positive or -1"),
    ('input { name: "A" data_type: TYPE_FP32 }', "input 'A'.dims: must not be empty when max_batch_size is 0"),
    ('input { name: "A" dims: [1] }', "input 'A'.data_type: must specify a data type"),
    ('input { name: "A" data_type: TYPE_FP32 dims: [1] } input { name: "A" data_type: TYPE_FP32 dims: [1] }',
     "input 'A': is declared more than once"),
    ('input { data_type: TYPE_FP32 dims: [1] }', "input[0]: must specify 'name'"),
    ('input { name: "A" data_type: TYPE_FP32 dims: [2, 3] reshape { shape: [5] } }',
     "input 'A'.reshape: shape [5] does not hold the same elements as dims [2, 3]"),
    ('input { name: "A" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [2, 3] }',
     "input 'A'.format: an image format needs 3 dims"),
    ('output { name: "B" data_type: TYPE_FP32 dims: [1] label_filename: "missing.txt" }',
     "output 'B'.label_filename: file 'missing.txt' does not exist"),
    ("instance_group { count: -2 }", "instance_group 'my_model_0'.count: must be >= 1, got -2"),
    ("instance_group { kind: KIND_CPU gpus: [0] }", "instance_group 'my_model_0'.gpus: must be empty for kind KIND_CPU"),
    ('instance_group { rate_limiter { resources { name: "R" count: 0 } } }',
     "rate_limiter.resources 'R'.count: must be > 0"),
    ("version_policy { latest { num_versions: 0 } }", "version_policy.latest.num_versions: must be >= 1"),
    ("version_policy { specific { } }", "version_policy.specific.versions: must list at least one version"),
    ("max_batch_size: 4 dynamic_batching { preferred_batch_size: [8] }",
     "dynamic_batching.preferred_batch_size: size 8 exceeds max_batch_size 4"),
    ("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
     "dynamic_batching.default_priority_level: must be in [1, 2], got 3"),
    ("max_batch_size: 4 dynamic_batching { default_priority_level: 1 }",
     "dynamic_batching.default_priority_level: must be 0 when priority_levels is not set"),
    ("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 1 "
     "priority_queue_policy { key: 5 value { } } }", "dynamic_batching.priority_queue_policy: level 5"),
    ("max_batch_size: 4 dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
     "dynamic_batching.preserve_ordering: requires a single priority level"),
    ("max_batch_size: 4 dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY } }",
     "dynamic_batching.preserve_ordering: cannot be combined with the DELAY timeout action"),
    ('sequence_batching { control_input { name: "C" control { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 }'
     " } }", "CONTROL_SEQUENCE_CORRID.data_type: must be one of TYPE_UINT64"),
    ('sequence_batching { control_input { name: "S" control { kind: CONTROL_SEQUENCE_START } } }',
     "CONTROL_SEQUENCE_START: must give exactly one of int32_false_true"),
    ("sequence_batching { } response_cache { enable: true }",
     "response_cache: cannot be enabled for a model with sequence_batching"),
    ("model_transaction_policy { decoupled: true } response_cache { enable: true }",
     "response_cache: cannot be enabled for a decoupled model"),
]


@pytest.mark.parametrize(("text", "message"), INVALID, ids=[m for _, m in INVALID])
def test_invalid_configs_name_model_and_field(text: str, message: str, tmp_path: Path) -> None:
    backend = "" if "backend" in message else 'backend: "x"\n'
    config = parsed(backend + text, name="my_model")
    with pytest.raises(ServerError) as error:
        validate_config(config, tmp_path)
    assert error.value.message.startswith("invalid model config for 'my_model': ")
    assert message in error.value.message


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
