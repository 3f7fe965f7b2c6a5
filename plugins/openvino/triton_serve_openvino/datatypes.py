"""Which OpenVINO element types the backend serves, and their ModelConfig names."""
from __future__ import annotations

import openvino as ov

from triton_serve.plugin import DataType

# ModelConfig type name -> OpenVINO element type. BYTES (TYPE_STRING) and BF16 are not served.
ELEMENT_TYPES: dict[str, ov.Type] = {
    "TYPE_BOOL": ov.Type.boolean,
    "TYPE_UINT8": ov.Type.u8,
    "TYPE_UINT16": ov.Type.u16,
    "TYPE_UINT32": ov.Type.u32,
    "TYPE_UINT64": ov.Type.u64,
    "TYPE_INT8": ov.Type.i8,
    "TYPE_INT16": ov.Type.i16,
    "TYPE_INT32": ov.Type.i32,
    "TYPE_INT64": ov.Type.i64,
    "TYPE_FP16": ov.Type.f16,
    "TYPE_FP32": ov.Type.f32,
    "TYPE_FP64": ov.Type.f64,
}
_CONFIG_NAMES = {element_type.get_type_name(): name for name, element_type in ELEMENT_TYPES.items()}
SERVED = ", ".join(name.removeprefix("TYPE_") for name in ELEMENT_TYPES)


def config_type_of(element_type: ov.Type) -> str | None:
    """The ModelConfig type name (``TYPE_FP32``) of an OpenVINO element type, or None if not served."""
    return _CONFIG_NAMES.get(element_type.get_type_name())


def element_type_of(data_type: int) -> ov.Type | None:
    """The OpenVINO element type of a ModelConfig ``TYPE_*`` value, or None if not served."""
    return ELEMENT_TYPES.get(DataType.Name(data_type))
