"""Model files: TorchScript (``model.pt``) and torch.export programs (``model.pt2``), loaded onto a device
and described: forward's arguments, how many results it returns, and (exported programs) every tensor's type."""
from __future__ import annotations

import sys
import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree  # the (args, kwargs) structure exported programs are called with
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

from triton_serve.plugin import ModelSpec, ServerError, Status

EXPORTED_SUFFIX = ".pt2"
AOTI_PLATFORM = "torch_aoti"  # Triton 2.67 (26.03): AOTInductor packages
# torch.export.load keeps its deserializer in a global (two loads at once fail), and silencing
# jit.load's deprecation edits process-wide warning filters: model files load one at a time.
_LOAD_LOCK = threading.Lock()


def model_file(model: ModelSpec) -> Path:
    """The file to serve: the config's ``default_model_filename``, else ``model.pt``, else ``model.pt2``."""
    chosen = model.model_file
    if not model.config.default_model_filename and not chosen.exists():
        exported = chosen.with_suffix(EXPORTED_SUFFIX)
        if exported.exists():
            return exported
    return chosen


@dataclass(frozen=True)
class ForwardArgument:
    """One argument of forward (after ``self``); ``default`` is meaningful only when not ``required``."""

    name: str
    required: bool = True
    default: Any = None


@dataclass(frozen=True)
class TensorSignature:
    """A tensor an exported program takes or returns; -1 marks a dynamic dim. ``first_dim_max`` is the
    largest size a dynamic first dim accepts, when the program bounds it."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    first_dim_max: int | None = None

    @property
    def first_dim_dynamic(self) -> bool:
        return bool(self.shape) and self.shape[0] == -1


class LoadedModel(ABC):
    """A model loaded onto its device. ``run`` calls forward and returns its results flattened."""

    arguments: list[ForwardArgument]
    takes_dict: bool = False  # forward takes one Dict[str, Tensor]: every input goes in by name
    output_count: int | None = None  # None: known only once forward has run

    @abstractmethod
    def run(self, arguments: Sequence[Any]) -> list[Any]:
        """Call forward with positional ``arguments``; return its results as a flat list."""


class TorchScriptModel(LoadedModel):
    """A ``torch.jit`` module; ``device`` None keeps the devices it was saved with (KIND_MODEL)."""

    def __init__(self, path: Path, device: torch.device | None) -> None:
        # Serving TorchScript is this backend's purpose, so torch's deprecation of jit.load is not news here.
        with _LOAD_LOCK, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is deprecated",
                                    category=DeprecationWarning)
            self.module = torch.jit.load(str(path), map_location=device)
        self.module.eval()
        if not hasattr(self.module, "forward"):
            raise ValueError("the TorchScript module has no forward method")
        schema = self.module.forward.schema
        self.arguments = [ForwardArgument(arg.name, not arg.has_default_value(),
                                          arg.default_value if arg.has_default_value() else None)
                          for arg in schema.arguments[1:]]
        self.takes_dict = len(schema.arguments) == 2 and isinstance(schema.arguments[1].type, torch.DictType)
        returns = schema.returns[0].type if len(schema.returns) == 1 else None
        if isinstance(returns, torch.TupleType):
            self.output_count = len(returns.elements())
        elif isinstance(returns, torch.TensorType):
            self.output_count = 1

    def run(self, arguments: Sequence[Any]) -> list[Any]:
        result = self.module(*arguments)
        if isinstance(result, torch.Tensor):
            return [result]
        if isinstance(result, (tuple, list)):
            return list(result)
        raise ServerError(f"forward returned {type(result).__name__}; the pytorch backend serves models that "
                          "return a Tensor or a tuple or list of Tensors", Status.INTERNAL)


class ExportedModel(LoadedModel):
    """A ``torch.export`` program (``torch.export.save``), run through ``ExportedProgram.module()``.

    Its arguments are the program's tensor inputs, flattened, named like its graph placeholders
    (forward's argument names for plain tensor arguments). Constant inputs the program was
    specialised on are passed back to it as they were exported.
    """

    def __init__(self, path: Path, device: torch.device | None) -> None:
        program = read_exported_program(path)
        self.inputs, self.outputs = describe_exported(program)
        self.arguments = [ForwardArgument(tensor.name) for tensor in self.inputs]
        self.output_count = len(self.outputs)
        self._leaves = [None if isinstance(spec.arg, TensorArgument) else spec.arg.value
                        for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
        self._tensor_leaves = [i for i, leaf in enumerate(self._leaves) if leaf is None]
        self._in_spec = program.call_spec.in_spec
        self.module = program.module() if device is None else _module_on(program, device)

    def run(self, arguments: Sequence[Any]) -> list[Any]:
        leaves = list(self._leaves)
        for position, value in zip(self._tensor_leaves, arguments):
            leaves[position] = value
        args, kwargs = pytree.tree_unflatten(leaves, self._in_spec)
        return pytree.tree_leaves(self.module(*args, **kwargs))


class AotiModel(LoadedModel):
    """An AOTInductor package (``torch._inductor.aoti_compile_and_package``; platform ``torch_aoti``).

    Its tensors are named as Triton 26.05 names them from the package's call specification: inputs
    ``ARGS[i]...`` / ``KWARGS[key]...``, outputs ``RESULT...`` (``RESULT`` alone for a single tensor), each
    accessor ``[index]`` or ``[key]`` in forward's order; ``INPUT__<i>`` / ``OUTPUT__<i>`` name them by position.
    """

    def __init__(self, path: Path, device: torch.device | None) -> None:
        device_index = device.index if device is not None and device.type == "cuda" else -1
        with _LOAD_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own pytree deprecations while it unpickles
            self.package = torch._inductor.aoti_load_package(str(path), device_index=device_index)
            in_spec, out_spec = (pytree.treespec_loads(text) for text in self.package.loader.get_call_spec())
        compiled_for = self.package.get_metadata().get("AOTI_DEVICE_KEY", "")
        wanted = device.type if device is not None else compiled_for
        if compiled_for and compiled_for != wanted:
            raise ValueError(f"the package was compiled for {compiled_for}, but the instance runs on {wanted}")
        self._in_spec = in_spec
        self.arguments = [ForwardArgument(name) for name in _leaf_names(in_spec, ("ARGS", "KWARGS"))]
        self.output_names = _leaf_names(out_spec, None)
        self.output_count = len(self.output_names)

    def run(self, arguments: Sequence[Any]) -> list[Any]:
        args, kwargs = pytree.tree_unflatten(list(arguments), self._in_spec)
        return pytree.tree_leaves(self.package(*args, **kwargs))


def _leaf_names(spec: pytree.TreeSpec, roots: tuple[str, str] | None) -> list[str]:
    """Each leaf's Triton name: ``roots`` name the (args, kwargs) pair of an input spec; None: ``RESULT``."""
    tree = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    names = []
    for path, _ in pytree.tree_flatten_with_path(tree)[0]:
        keys = list(path)
        name = "RESULT"
        if roots is not None:
            name = roots[getattr(keys.pop(0), "idx", 0)]
        for key in keys:
            if isinstance(key, pytree.SequenceKey):
                name += f"[{key.idx}]"
            elif isinstance(key, pytree.MappingKey):
                name += f"[{key.key}]"
            else:
                name += f"[{getattr(key, 'name', key)}]"
        names.append(name)
    return names


def read_exported_program(path: Path) -> torch.export.ExportedProgram:
    """``torch.export.load``, one file at a time. Some torch versions (2.11) warn that a buffer they read the
    file into is not writable: a note about torch's own copy, not about the model, so it is not passed on."""
    with _LOAD_LOCK, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
        return torch.export.load(str(path))


def load_model(path: Path, device: torch.device | None, aoti: bool = False) -> LoadedModel:
    """Load ``path`` (``aoti``: an AOTInductor package; ``.pt2``: exported program; else TorchScript); raises
    whatever torch raises for a bad file."""
    if aoti:
        return AotiModel(path, device)
    if path.suffix == EXPORTED_SUFFIX:
        return ExportedModel(path, device)
    return TorchScriptModel(path, device)


def error_summary(error: BaseException) -> str:
    """The line of a torch error that says what went wrong: TorchScript interpreter errors end with it,
    other errors start with it."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if lines[0].startswith("The following operation failed in the TorchScript interpreter"):
        return lines[-1]
    return lines[0] if lines[0].startswith(type(error).__name__) else f"{type(error).__name__}: {lines[0]}"


def describe_exported(program: torch.export.ExportedProgram) -> tuple[list[TensorSignature], list[TensorSignature]]:
    """The tensor inputs and outputs of an exported program, in forward's (flattened) order."""
    nodes = {node.name: node for node in program.graph.nodes}

    def signature(name: str) -> TensorSignature:
        value = nodes[name].meta["val"]
        shape = tuple(-1 if isinstance(dim, torch.SymInt) else int(dim) for dim in value.shape)
        first_dim_max = None
        if shape and isinstance(value.shape[0], torch.SymInt):
            bounds = program.range_constraints.get(value.shape[0].node.expr)
            if bounds is not None and bool(bounds.upper < sys.maxsize):
                first_dim_max = int(bounds.upper)
        return TensorSignature(name, value.dtype, shape, first_dim_max)

    inputs = [signature(spec.arg.name) for spec in program.graph_signature.input_specs
              if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, TensorArgument)]
    outputs = []
    for spec in program.graph_signature.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        if not isinstance(spec.arg, TensorArgument):
            raise TypeError(f"the exported program returns a constant ({spec.arg}); only tensor results "
                            "can be served")
        outputs.append(signature(spec.arg.name))
    return inputs, outputs


def _module_on(program: torch.export.ExportedProgram, device: torch.device) -> torch.nn.Module:
    """The program's module with its parameters, buffers and constants on ``device``."""
    try:
        from torch.export.passes import move_to_device_pass
    except ImportError:  # torch < 2.6 has no pass that also moves graph constants
        return program.module().to(device)
    return move_to_device_pass(program, device).module()
