"""Request and response content, tensors and errors across a process boundary, in one binary form.

Content (``RequestContent``, ``ResponseContent``) crosses as metadata, one plain value per field of its dataclass
(``encode_content``), and one buffer with the bytes of all its tensors. A tensor crosses as a descriptor,
``TensorRef`` (name, datatype, shape, offset, byte size), into that buffer: numbers as little-endian row-major
elements, BYTES in Triton's length-prefixed form (a 4-byte little-endian length before each element), exactly as
KServe's binary extension carries them, so a receiver builds its tensors as views of the bytes it received
(``Tensor.from_wire``: no copy, no array until a model asks). An input in a shared-memory region crosses with no
bytes (its parameters name the region, which the receiver reads). An error crosses as (message, status name). The
front-end channel (front-end processes and triton-serve-ray), the Python backend's frames and arenas and the
PyTriton binding all use these functions; none of them lists a content field.
"""
from __future__ import annotations

import dataclasses
import importlib
import operator
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

from .datatypes import BY_NAME, element_count, from_wire_bytes, serialize_bytes
from .errors import ServerError, Status
from .inference import (InferenceRequest, InferenceResponse, Parameters, RequestContent, RequestedOutput,
                        ResponseContent, Tensor)

# (name, datatype, shape, offset, byte size): where one tensor's bytes sit in a message's buffer
TensorRef = tuple[str, str, tuple[int, ...], int, int]
# Bytes a tensor's elements are laid out in
Buffer = bytes | bytearray | memoryview
# A ServerError on the wire: (message, status name)
WireError = tuple[str, str]
IN_REGION = -1  # a TensorRef's byte size for a tensor whose bytes stay in a shared-memory region (none cross)
# Content on the wire: one plain value per field of its dataclass, in field order
ContentMeta = tuple[Any, ...]
Content = TypeVar("Content", RequestContent, ResponseContent)


_COPIED_THROUGH_BYTES = 4096  # an array this small is copied fastest through one bytes object (a view costs more)


class TensorLayout:
    """Gives each tensor of a message an offset (a multiple of ``alignment``) in one buffer of ``size``
    bytes; ``write`` copies them into a buffer (a shared-memory arena, say), ``tobytes`` makes one."""

    def __init__(self, alignment: int = 8) -> None:
        self.alignment = alignment
        self.size = 0
        self._pending: list[tuple[int, np.ndarray | Buffer]] = []

    def add(self, name: str, datatype: str, array: np.ndarray) -> TensorRef:
        """Lay out ``array`` (cast to ``datatype``'s element type if it is not already) and describe it."""
        shape = array.shape  # a tuple of ints
        if datatype == "BYTES":
            return self._place(name, datatype, shape, serialize_bytes(array))
        wire = BY_NAME[datatype].numpy
        if array.dtype != wire:  # a bfloat16 array (ml_dtypes, torch's numpy) keeps its bit patterns
            array = array.view(wire) if datatype == "BF16" and array.dtype.name == "bfloat16" else array.astype(wire)
        return self._place(name, datatype, shape, array)

    def add_tensor(self, tensor: Tensor) -> TensorRef:
        """Lay out a Tensor: the wire bytes it keeps as they are, else its ``data``."""
        if tensor.wire is None:
            data = tensor.data
            if type(data) is not np.ndarray or data.shape != tuple(tensor.shape):
                data = np.asarray(data).reshape(tensor.shape)
            return self.add(tensor.name, tensor.datatype, data)
        return self._place(tensor.name, tensor.datatype, tuple(tensor.shape), tensor.wire)

    def _place(self, name: str, datatype: str, shape: tuple[int, ...], payload: np.ndarray | Buffer) -> TensorRef:
        nbytes = payload.nbytes if isinstance(payload, (np.ndarray, memoryview)) else len(payload)
        offset = -(-self.size // self.alignment) * self.alignment
        self.size = offset + nbytes
        self._pending.append((offset, payload))
        return name, datatype, shape, offset, nbytes

    def write(self, buf: memoryview | bytearray) -> None:
        """Copy the tensors added since the last write into ``buf`` at their offsets."""
        for offset, payload in self._pending:
            if not isinstance(payload, np.ndarray):
                buf[offset:offset + len(payload)] = payload
            elif payload.nbytes <= _COPIED_THROUGH_BYTES:
                buf[offset:offset + payload.nbytes] = payload.tobytes()
            elif payload.size:
                np.ndarray(payload.shape, payload.dtype, buffer=buf, offset=offset)[...] = payload
        self._pending.clear()

    def tobytes(self) -> bytearray:
        """A new buffer holding the tensors (zero bytes in the alignment gaps)."""
        buf = bytearray(self.size)
        self.write(buf)
        return buf


def pack_tensors(tensors: Iterable[tuple[str, str, np.ndarray]],
                 alignment: int = 8) -> tuple[list[TensorRef], bytearray]:
    """The descriptors of ``(name, datatype, array)`` tensors and the one buffer of their bytes."""
    layout = TensorLayout(alignment)
    refs = [layout.add(name, datatype, array) for name, datatype, array in tensors]
    return refs, layout.tobytes()


def read_tensor(buf: memoryview | bytes | bytearray, ref: TensorRef, copy: bool = False) -> np.ndarray:
    """The array ``ref`` describes in ``buf``: a view of it (read-only where ``buf`` is), or a copy with
    ``copy``. BYTES elements are always decoded into an object array of bytes. ValueError if ``buf`` holds
    fewer or more bytes for the tensor than its shape needs."""
    _name, datatype, shape, offset, nbytes = ref
    array = from_wire_bytes(datatype, shape, memoryview(buf)[offset:offset + nbytes])
    return array.copy() if copy and datatype != "BYTES" else array


def tensor_from(buf: Buffer, ref: TensorRef, parameters: Parameters | None = None, copy: bool = False) -> Tensor:
    """The Tensor ``ref`` describes in ``buf``, keeping its bytes in wire form: a view of ``buf`` (which must not
    change while the tensor lives), or with ``copy`` a copy (``buf`` is an arena its sender reuses). ValueError if
    ``buf`` holds fewer or more bytes for it than its shape needs."""
    name, datatype, shape, offset, nbytes = ref
    view = memoryview(buf)[offset:offset + nbytes]
    return Tensor.from_wire(name, datatype, tuple(shape), bytes(view) if copy else view, parameters)


def encode_error(error: ServerError) -> WireError:
    """``error`` as (message, status name), to cross a process boundary."""
    return error.message, error.status.name


def decode_error(error: WireError) -> ServerError:
    """The ServerError, with its status, that ``encode_error`` described."""
    return ServerError(error[0], Status[error[1]])


# ---- content -------------------------------------------------------------------------------------

def plain(value: Any) -> Any:
    """``value`` with numpy scalars turned into Python ones: marshal refuses some and writes others as the bytes of
    their buffer."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def _encode_tensors(tensors: tuple[Tensor, ...], layout: TensorLayout) -> list[tuple[TensorRef, Parameters | None]]:
    described = []
    for tensor in tensors:
        parameters = plain(tensor.parameters) if tensor.parameters else None
        if parameters is not None and _in_region(tensor, parameters):  # the receiver reads the region
            described.append(((tensor.name, tensor.datatype, tuple(tensor.shape), 0, IN_REGION), parameters))
        else:
            described.append((layout.add_tensor(tensor), parameters))
    return described


def _in_region(tensor: Tensor, parameters: Parameters) -> bool:
    """Whether ``tensor``'s bytes are in the shared-memory region its parameters name, not yet read."""
    return "shared_memory_region" in parameters and tensor.wire is None and tensor.size != element_count(tensor.shape)


def _decode_tensors(described: list[tuple[TensorRef, Parameters | None]], buf: Buffer,
                    copy: bool) -> tuple[Tensor, ...]:
    tensors = []
    for ref, parameters in described:
        if ref[4] == IN_REGION:
            tensors.append(Tensor(ref[0], ref[1], tuple(ref[2]), np.empty(0, BY_NAME[ref[1]].numpy), parameters))
        else:
            tensors.append(tensor_from(buf, ref, parameters, copy))
    return tuple(tensors)


def _encode_outputs(outputs: tuple[RequestedOutput, ...], _layout: TensorLayout) -> list[tuple[str, Parameters | None]]:
    return [(output.name, output.parameters or None) for output in outputs]


def _decode_outputs(described: list[tuple[str, Parameters | None]], _buf: Buffer,
                    _copy: bool) -> tuple[RequestedOutput, ...]:
    return tuple(RequestedOutput(name, parameters or {}) for name, parameters in described)


def _encode_error(error: ServerError | None, _layout: TensorLayout) -> WireError | None:
    return None if error is None else encode_error(error)


def _decode_error(error: WireError | None, _buf: Buffer, _copy: bool) -> ServerError | None:
    return None if error is None else decode_error(error)


_ATOMS = frozenset({str, int, float, bool, bytes, type(None)})


def _encode_plain(value: Any, _layout: TensorLayout) -> Any:
    """A plain field as marshal writes it (marshal would write a numpy scalar as the bytes of its buffer)."""
    return value if type(value) in _ATOMS or not value else plain(value)


# How a field crosses, by its ``wire`` metadata (inference.TENSORS, ...); a field without one crosses as a plain
# value (``plain``: numpy scalars become Python ones).
_ENCODERS: dict[str, Callable[[Any, TensorLayout], Any]] = {
    "tensors": _encode_tensors, "requested_outputs": _encode_outputs, "error": _encode_error, "": _encode_plain}
_DECODERS: dict[str, Callable[[Any, Buffer, bool], Any]] = {
    "tensors": _decode_tensors, "requested_outputs": _decode_outputs, "error": _decode_error}


class _Plan:
    """How each field of one content type crosses, worked out once per type from its dataclass fields."""

    __slots__ = ("values", "encoders", "decoders")

    def __init__(self, content_type: type) -> None:
        fields = dataclasses.fields(content_type)
        getter = operator.attrgetter(*(item.name for item in fields))
        self.values: Callable[[Any], tuple[Any, ...]] = getter if len(fields) > 1 else lambda content: (getter(content),)
        self.encoders = tuple(_ENCODERS[item.metadata.get("wire", "")] for item in fields)
        self.decoders = tuple(_DECODERS.get(item.metadata.get("wire", ""), None) for item in fields)


_PLANS: dict[type, _Plan] = {}


def _plan(content_type: type) -> _Plan:
    plan = _PLANS.get(content_type)
    if plan is None:
        plan = _PLANS[content_type] = _Plan(content_type)
    return plan


def encode_content(content: RequestContent | ResponseContent, layout: TensorLayout) -> ContentMeta:
    """``content`` as metadata, one plain value per field of its dataclass, its tensors added to ``layout`` (whose
    buffer travels with the metadata); numpy scalars among its plain values become Python ones."""
    plan = _plan(type(content))
    return tuple([encoder(value, layout) for encoder, value in zip(plan.encoders, plan.values(content))])


def decode_content(content_type: type[Content], meta: ContentMeta, buf: Buffer, copy: bool = False) -> Content:
    """The ``content_type`` that ``encode_content`` described, its tensors views of ``buf`` (which must not change
    while they live) or, with ``copy``, copies. TypeError or ValueError when ``meta`` or ``buf`` do not fit it."""
    decoders = _plan(content_type).decoders
    if len(meta) != len(decoders):
        raise ValueError(f"{content_type.__name__} has {len(decoders)} fields, {len(meta)} came")
    return content_type(*[value if decoder is None else decoder(value, buf, copy)
                          for decoder, value in zip(decoders, meta)])


def pack_content(content: RequestContent | ResponseContent) -> tuple[ContentMeta, bytearray]:
    """``content``'s metadata and the one buffer of its tensors' bytes."""
    layout = TensorLayout()
    meta = encode_content(content, layout)
    return meta, layout.tobytes()


# ---- which content types a process uses ----------------------------------------------------------

def content_type_names() -> dict[str, str]:
    """This process's content types (``InferenceRequest.content_type``, ``InferenceResponse.content_type``) as
    "module:qualified name", for a process it starts (``content_type_named``, ``use_content_types``)."""
    return {"request": _name(InferenceRequest.content_type), "response": _name(InferenceResponse.content_type)}


def _name(content_type: type) -> str:
    return f"{content_type.__module__}:{content_type.__qualname__}"


def content_type_named(name: str, base: type[Content]) -> type[Content]:
    """The ``base`` subclass (or ``base``) called ``name`` ("module:qualified name"), imported; ValueError if it
    is none."""
    module, _, qualname = name.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not (isinstance(found, type) and issubclass(found, base)):
        raise ValueError(f"{name} is not a {base.__name__}")
    return found


def use_content_types(names: dict[str, str]) -> None:
    """Make the content types that ``content_type_names`` named in the starting process this process's."""
    InferenceRequest.content_type = content_type_named(names["request"], RequestContent)
    InferenceResponse.content_type = content_type_named(names["response"], ResponseContent)
