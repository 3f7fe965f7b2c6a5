"""Model configuration: read ``config.pbtxt``, fill Triton's defaults, and print Triton's JSON shape."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from .errors import ServerError
from .protos.model_config_pb2 import ModelConfig, ModelInstanceGroup

CONFIG_FILENAME = "config.pbtxt"
_INT64_TYPES = (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64)


def read_config(model_dir: Path, name: str, config_name: str = "") -> ModelConfig:
    """Parse ``<model_dir>/config.pbtxt`` (or ``configs/<config_name>.pbtxt`` when it exists).

    A model without a config file gets an empty config, for auto-complete to fill.
    """
    path = model_dir / CONFIG_FILENAME
    if config_name and (model_dir / "configs" / f"{config_name}.pbtxt").is_file():
        path = model_dir / "configs" / f"{config_name}.pbtxt"
    config = ModelConfig()
    if path.is_file():
        try:
            text_format.Parse(path.read_text(encoding="utf-8"), config)
        except (text_format.ParseError, UnicodeDecodeError) as error:
            raise ServerError(f"failed to parse model config for '{name}' ({path.name}): {error}") from None
    return config


def parse_config_json(text: str, name: str) -> ModelConfig:
    """Parse a ModelConfig given as JSON (the model-load override)."""
    try:
        return json_format.Parse(text, ModelConfig())
    except json_format.ParseError as error:
        raise ServerError(f"failed to parse the config override for '{name}': {error}") from None


def apply_defaults(config: ModelConfig, name: str,
                   auto_kind: ModelInstanceGroup.Kind = ModelInstanceGroup.KIND_CPU) -> None:
    """Fill what Triton fills before validation: the name, version policy and instance groups.
    KIND_AUTO groups become KIND_GPU when they list ``gpus``, else ``auto_kind``."""
    if not config.name:
        config.name = name
    elif config.name != name:
        raise ServerError(f"unexpected directory name '{name}' for model '{config.name}', "
                          "directory name must equal model name")
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if not config.instance_group and not config.HasField("ensemble_scheduling"):  # an ensemble has no instances
        config.instance_group.add()
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{name}_{index}"
        if group.count < 1:
            group.count = 1
        if group.kind == ModelInstanceGroup.KIND_AUTO:
            group.kind = ModelInstanceGroup.KIND_GPU if group.gpus else auto_kind


def config_to_json(config: ModelConfig) -> dict[str, Any]:
    """Triton's JSON for a config: proto field names, defaults printed, 64-bit integers as numbers."""
    data = json_format.MessageToDict(config, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    _int64_as_numbers(config, data)
    return data


def _int64_as_numbers(message: Message, data: dict[str, Any]) -> None:
    for field in message.DESCRIPTOR.fields:
        if field.name not in data:
            continue
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            if value_field.message_type is not None:
                for key, sub in data[field.name].items():
                    map_key = int(key) if field.message_type.fields_by_name["key"].type in _INT64_TYPES else key
                    _int64_as_numbers(value[map_key], sub)
            elif value_field.type in _INT64_TYPES:
                data[field.name] = {k: int(v) for k, v in data[field.name].items()}
        elif field.message_type is not None:
            if field.is_repeated:
                for sub_message, sub in zip(value, data[field.name]):
                    _int64_as_numbers(sub_message, sub)
            else:
                _int64_as_numbers(value, data[field.name])
        elif field.type in _INT64_TYPES:
            raw = data[field.name]
            data[field.name] = [int(v) for v in raw] if isinstance(raw, list) else int(raw)
