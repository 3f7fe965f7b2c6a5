"""Our protos must match tritonclient's descriptors field by field and interoperate on the wire."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, text_format
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
    MethodDescriptor,
    ServiceDescriptor,
)
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as triton_config
from tritonclient.grpc import service_pb2 as triton_service

from triton_serve._engine.protos import grpc_service_pb2, health_pb2, model_config_pb2

CONFIG_PBTXT = """
name: "resnet50"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size: 16
version_policy: { latest: { num_versions: 2 } }
input [
  {
    name: "input"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
  }
]
output [
  {
    name: "probs"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    label_filename: "labels.txt"
  }
]
instance_group [
  { count: 2, kind: KIND_GPU, gpus: [ 0, 1 ] },
  { count: 1, kind: KIND_CPU }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  priority_queue_policy {
    key: 1
    value: { timeout_action: DELAY, default_timeout_microseconds: 5000, max_queue_size: 8 }
  }
}
parameters { key: "intra_op_thread_count" value: { string_value: "4" } }
parameters: { key: "execution_mode" value: { string_value: "1" } }
model_warmup [
  {
    name: "zeros"
    batch_size: 1
    inputs { key: "input" value: { data_type: TYPE_FP32, dims: [ 3, 224, 224 ], zero_data: true } }
  }
]
"""


Names = Mapping[str, object]


def _type_name(field: FieldDescriptor) -> str:
    """Full name of a field's message or enum type, or "" for scalars."""
    if field.message_type is not None:
        return field.message_type.full_name
    return field.enum_type.full_name if field.enum_type is not None else ""


def _field_facts(field: FieldDescriptor) -> dict[str, object]:
    """Everything about a field that affects the schema or the wire format."""
    oneof = field.containing_oneof
    return {
        "number": field.number,
        "type": field.type,
        "repeated": field.is_repeated,
        "has_presence": field.has_presence,
        "type_name": _type_name(field),
        "oneof": oneof.name if oneof is not None else None,
    }


def _method_facts(method: MethodDescriptor) -> dict[str, object]:
    """Request/response types and streaming kinds of an RPC."""
    return {
        "input": method.input_type.full_name,
        "output": method.output_type.full_name,
        "client_streaming": method.client_streaming,
        "server_streaming": method.server_streaming,
    }


def _file_facts(file: FileDescriptor) -> dict[str, object]:
    """Package and imports of a .proto file."""
    return {"package": file.package, "dependencies": sorted(d.name for d in file.dependencies)}


def _compare_keys(path: str, what: str, ours: Names, theirs: Names) -> list[str]:
    """Report names present on only one side."""
    missing = sorted(set(theirs) - set(ours))
    extra = sorted(set(ours) - set(theirs))
    return [f"{path}: {what} {name!r} missing in ours" for name in missing] + [
        f"{path}: {what} {name!r} not in tritonclient" for name in extra
    ]


def _common(ours: Names, theirs: Names) -> list[str]:
    """Names present on both sides, in a stable order."""
    return sorted(set(ours) & set(theirs))


def _compare_facts(path: str, ours: dict[str, object], theirs: dict[str, object]) -> list[str]:
    """Report every fact whose value differs."""
    return [
        f"{path}: {key} ours={ours[key]!r} theirs={theirs[key]!r}"
        for key in theirs
        if ours[key] != theirs[key]
    ]


def compare_enums(ours: EnumDescriptor, theirs: EnumDescriptor) -> list[str]:
    """Differences in enum value names and numbers."""
    path = theirs.full_name
    ours_values = {v.name: v.number for v in ours.values}
    theirs_values = {v.name: v.number for v in theirs.values}
    diffs = _compare_keys(path, "value", ours_values, theirs_values)
    for name in _common(ours_values, theirs_values):
        diffs += _compare_facts(
            f"{path}.{name}", {"number": ours_values[name]}, {"number": theirs_values[name]}
        )
    return diffs


def compare_messages(ours: Descriptor, theirs: Descriptor) -> list[str]:
    """Differences between two messages, recursing into nested messages, map entries and enums."""
    path = theirs.full_name
    diffs = _compare_facts(
        path,
        {"map_entry": ours.GetOptions().map_entry},
        {"map_entry": theirs.GetOptions().map_entry},
    )
    diffs += _compare_keys(path, "field", ours.fields_by_name, theirs.fields_by_name)
    diffs += _compare_keys(path, "oneof", ours.oneofs_by_name, theirs.oneofs_by_name)
    for name in _common(ours.fields_by_name, theirs.fields_by_name):
        ours_field, theirs_field = ours.fields_by_name[name], theirs.fields_by_name[name]
        diffs += _compare_facts(f"{path}.{name}", _field_facts(ours_field), _field_facts(theirs_field))
    return diffs + _compare_children(path, ours, theirs)


def _compare_children(
    path: str, ours: Descriptor | FileDescriptor, theirs: Descriptor | FileDescriptor
) -> list[str]:
    """Compare the nested messages and enums of a message, or the top-level ones of a file."""
    messages = "message_types_by_name" if isinstance(theirs, FileDescriptor) else "nested_types_by_name"
    diffs = []
    for what, attr, compare in (
        ("message", messages, compare_messages),
        ("enum", "enum_types_by_name", compare_enums),
    ):
        ours_items, theirs_items = getattr(ours, attr), getattr(theirs, attr)
        diffs += _compare_keys(path, what, ours_items, theirs_items)
        for name in _common(ours_items, theirs_items):
            diffs += compare(ours_items[name], theirs_items[name])
    return diffs


def compare_services(ours: ServiceDescriptor, theirs: ServiceDescriptor) -> list[str]:
    """Differences in RPC names, request/response types and streaming kinds."""
    path = theirs.full_name
    ours_methods = {m.name: m for m in ours.methods}
    theirs_methods = {m.name: m for m in theirs.methods}
    diffs = _compare_keys(path, "method", ours_methods, theirs_methods)
    for name in _common(ours_methods, theirs_methods):
        diffs += _compare_facts(
            f"{path}.{name}", _method_facts(ours_methods[name]), _method_facts(theirs_methods[name])
        )
    return diffs


def compare_files(ours: FileDescriptor, theirs: FileDescriptor) -> list[str]:
    """All schema differences between two .proto files as readable lines, empty when equal."""
    path = theirs.name
    diffs = _compare_facts(path, _file_facts(ours), _file_facts(theirs))
    diffs += _compare_keys(path, "service", ours.services_by_name, theirs.services_by_name)
    for name in _common(ours.services_by_name, theirs.services_by_name):
        diffs += compare_services(ours.services_by_name[name], theirs.services_by_name[name])
    return sorted(diffs + _compare_children(path, ours, theirs))


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (model_config_pb2.DESCRIPTOR, triton_config.DESCRIPTOR),
        (grpc_service_pb2.DESCRIPTOR, triton_service.DESCRIPTOR),
    ],
    ids=["model_config", "grpc_service"],
)
def test_descriptors_match_tritonclient(ours: FileDescriptor, theirs: FileDescriptor) -> None:
    assert compare_files(ours, theirs) == []


def test_compare_files_reports_differences() -> None:
    proto = descriptor_pb2.FileDescriptorProto()
    triton_config.DESCRIPTOR.CopyToProto(proto)
    model_input = next(m for m in proto.message_type if m.name == "ModelInput")
    next(f for f in model_input.field if f.name == "dims").number = 40
    data_type = next(e for e in proto.enum_type if e.name == "DataType")
    data_type.value.pop()
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    altered = pool.FindFileByName(proto.name)

    diffs = compare_files(model_config_pb2.DESCRIPTOR, altered)

    assert diffs == [
        "inference.DataType: value 'TYPE_BF16' not in tritonclient",
        "inference.ModelInput.dims: number ours=4 theirs=40",
    ]


def test_config_pbtxt_parses_and_is_wire_compatible() -> None:
    config = text_format.Parse(CONFIG_PBTXT, model_config_pb2.ModelConfig())

    assert config.max_batch_size == 16
    assert list(config.input[0].dims) == [3, 224, 224]
    assert config.input[0].format == model_config_pb2.ModelInput.FORMAT_NCHW
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert list(config.instance_group[0].gpus) == [0, 1]
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert config.dynamic_batching.priority_queue_policy[1].max_queue_size == 8
    assert config.parameters["intra_op_thread_count"].string_value == "4"
    assert config.version_policy.latest.num_versions == 2
    assert config.model_warmup[0].inputs["input"].zero_data

    expected_theirs = text_format.Parse(CONFIG_PBTXT, triton_config.ModelConfig())
    assert triton_config.ModelConfig.FromString(config.SerializeToString()) == expected_theirs
    assert model_config_pb2.ModelConfig.FromString(expected_theirs.SerializeToString()) == config


def _fill_infer_request(request: Message) -> Message:
    """Populate a ModelInferRequest (ours or tritonclient's) the way a client sending raw tensors does."""
    request.model_name = "resnet50"
    request.model_version = "1"
    request.id = "req-7"
    request.parameters["priority"].uint64_param = 1
    request.parameters["sequence_id"].string_param = "abc"
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 4])
    tensor.parameters["binary_data_size"].int64_param = 16
    request.outputs.add(name="probs").parameters["classification"].int64_param = 3
    request.raw_input_contents.append(bytes(range(16)))
    return request


def test_infer_request_is_wire_compatible() -> None:
    theirs = _fill_infer_request(triton_service.ModelInferRequest())
    ours = grpc_service_pb2.ModelInferRequest.FromString(theirs.SerializeToString())

    assert ours == _fill_infer_request(grpc_service_pb2.ModelInferRequest())
    assert ours.raw_input_contents[0] == bytes(range(16))
    assert ours.parameters["priority"].WhichOneof("parameter_choice") == "uint64_param"
    assert ours.inputs[0].parameters["binary_data_size"].int64_param == 16
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)
    assert triton_service.ModelInferRequest.FromString(ours.SerializeToString()) == theirs


def test_health_service_shape() -> None:
    service = health_pb2.DESCRIPTOR.services_by_name["Health"]
    streaming = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert service.full_name == "grpc.health.v1.Health"
    assert streaming == {"Check": (False, False), "Watch": (False, True)}
    statuses = health_pb2.HealthCheckResponse.ServingStatus
    assert {name: statuses.Value(name) for name in statuses.keys()} == {
        "UNKNOWN": 0,
        "SERVING": 1,
        "NOT_SERVING": 2,
        "SERVICE_UNKNOWN": 3,
    }
    assert health_pb2.HealthCheckRequest.DESCRIPTOR.fields_by_name["service"].number == 1
    assert health_pb2.HealthCheckResponse.DESCRIPTOR.fields_by_name["status"].number == 1
