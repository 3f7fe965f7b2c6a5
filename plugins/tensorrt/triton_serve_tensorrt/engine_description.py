"""What a TensorRT engine says about its IO tensors, as plain data, and TensorRT -> Triton datatypes."""
from __future__ import annotations

from dataclasses import dataclass, field

from triton_serve.plugin import ServerError, Status

Shape = tuple[int, ...]

# TensorRT ``DataType`` member names -> ModelConfig ``TYPE_*`` names. TensorRT's other types
# (FP8, INT4, FP4, E8M0) have no Triton datatype.
CONFIG_TYPE_OF_TENSORRT: dict[str, str] = {
    "FLOAT": "TYPE_FP32",
    "HALF": "TYPE_FP16",
    "BF16": "TYPE_BF16",
    "INT8": "TYPE_INT8",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
}


@dataclass(frozen=True)
class ProfileShapes:
    """One optimization profile's minimum, optimum and maximum shape for one input."""

    min: Shape
    opt: Shape
    max: Shape

    def accepts(self, shape: Shape) -> bool:
        """Whether a concrete shape lies within [min, max] in every dimension."""
        return len(shape) == len(self.min) and all(
            low <= dim <= high for low, dim, high in zip(self.min, shape, self.max))

    def distance(self, shape: Shape) -> int:
        """Manhattan distance of ``shape`` from the optimum shape."""
        return sum(abs(best - dim) for best, dim in zip(self.opt, shape))


@dataclass(frozen=True)
class TensorDescription:
    """One IO tensor of an engine. ``shape`` holds -1 for dynamic dimensions; ``profiles`` holds one
    ProfileShapes per optimization profile for an input, and is empty for outputs and shape tensors."""

    name: str
    is_input: bool
    tensorrt_type: str
    shape: Shape
    is_shape_tensor: bool = False
    profiles: tuple[ProfileShapes, ...] = ()

    @property
    def has_batch_dim(self) -> bool:
        """Whether the first dimension is dynamic, as a batch dimension must be."""
        return len(self.shape) > 0 and self.shape[0] == -1

    def config_type(self, model: str) -> str:
        """The ModelConfig datatype name, or an UNSUPPORTED error naming the model and tensor."""
        try:
            return CONFIG_TYPE_OF_TENSORRT[self.tensorrt_type]
        except KeyError:
            kind = "input" if self.is_input else "output"
            raise ServerError(f"model '{model}': engine {kind} '{self.name}' has TensorRT type "
                              f"{self.tensorrt_type}, which no Triton datatype carries", Status.UNSUPPORTED) from None


@dataclass(frozen=True)
class EngineDescription:
    """An engine's IO tensors in the engine's order, and how many optimization profiles it has."""

    tensors: tuple[TensorDescription, ...]
    num_profiles: int = 1
    _by_name: dict[str, TensorDescription] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {tensor.name: tensor for tensor in self.tensors})

    @property
    def inputs(self) -> list[TensorDescription]:
        return [tensor for tensor in self.tensors if tensor.is_input]

    @property
    def outputs(self) -> list[TensorDescription]:
        return [tensor for tensor in self.tensors if not tensor.is_input]

    def get(self, name: str) -> TensorDescription | None:
        return self._by_name.get(name)

    def supports_batching(self) -> bool:
        """Whether every (non-shape) IO tensor has a dynamic first dimension to batch along."""
        tensors = [tensor for tensor in self.tensors if not tensor.is_shape_tensor]
        return bool(tensors) and any(t.is_input for t in tensors) and all(t.has_batch_dim for t in tensors)
