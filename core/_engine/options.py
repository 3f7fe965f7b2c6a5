"""Backend options declared once as typed dataclasses, and the one parser of their text values."""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .errors import ServerError

if TYPE_CHECKING:
    from .backend import Backend, ModelSpec

T = TypeVar("T")

# Triton's boolean words (backend_common.cc ParseBoolValue), matched in any case.
TRUE_WORDS = ("true", "on", "1")
FALSE_WORDS = ("false", "off", "0")
BOOL_EXPECTED = "expected true/false, on/off or 1/0"

_DECLARATION = "triton_serve.option"


def parse_bool(text: str) -> bool:
    """A boolean in Triton's words: true/on/1 or false/off/0, in any case; else ValueError."""
    word = text.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(BOOL_EXPECTED)


@dataclass(frozen=True)
class _Declaration:
    doc: str
    key: str | None
    minimum: float | None
    check: Callable[[Any], None] | None


def option(default: Any = dataclasses.MISSING, *, doc: str, key: str | None = None, minimum: float | None = None,
           check: Callable[[Any], None] | None = None) -> Any:
    """Declare one field of a backend's ``Options`` or ``Parameters`` dataclass.

    Without ``default`` the option is required: a model (or server) that does not set it fails to load,
    with an error naming the key. ``key`` is what users write (default: the field name with ``-`` for
    ``_``, as in ``default-max-batch-size``); ``minimum`` bounds a number; ``check(value)`` raises
    ValueError with the reason for any other rule. The field's annotation gives its type: ``bool``,
    ``int``, ``float``, ``str``, a ``Literal[...]`` of choices, or any of these ``| None`` (``None``:
    not set).
    """
    metadata = {_DECLARATION: _Declaration(doc, key, minimum, check)}
    if default is dataclasses.MISSING:  # keyword-only, so that it may follow fields with defaults
        return dataclasses.field(kw_only=True, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class NoOptions:
    """The options of a backend that declares none."""


@dataclass(frozen=True)
class AutoCompleteOptions:
    """Triton's ``default-max-batch-size``, for backends whose auto-complete turns batching on; a backend's
    ``Options`` dataclass subclasses it to declare the option."""

    default_max_batch_size: int = option(4, minimum=0, doc="the max_batch_size auto-complete gives a model that "
                                                           "can batch (Triton's default 4)")


@dataclass(frozen=True)
class DeclaredOption:
    """One declared option as users see it: the key, type, default and doc."""

    name: str
    key: str
    kind: type  # bool, int, float or str
    choices: tuple[Any, ...]
    default: Any  # dataclasses.MISSING: required
    doc: str
    minimum: float | None
    check: Callable[[Any], None] | None

    def type_text(self) -> str:
        """The type as ``triton-serve plugins`` prints it: ``bool``, ``int >= 0``, ``one of YES, NO``..."""
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        text = self.kind.__name__
        return text if self.minimum is None else f"{text} >= {self.minimum:g}"

    def expected(self) -> str:
        """What a valid value is, as an error message says it."""
        if self.kind is bool:
            return BOOL_EXPECTED
        if self.choices:
            return "expected one of " + ", ".join(map(str, self.choices))
        noun = "an integer" if self.kind is int else "a number"
        return f"expected {noun}" if self.minimum is None else f"expected {noun} >= {self.minimum:g}"

    def parse(self, text: str) -> Any:
        """The typed value of ``text``; ValueError with the reason when it is not valid."""
        value = self._convert(text)
        if self.minimum is not None and value < self.minimum:
            raise ValueError(self.expected())
        if self.check is not None:
            self.check(value)
        return value

    def _convert(self, text: str) -> Any:
        if self.kind is bool:
            return parse_bool(text)
        if self.kind is str:
            if not self.choices:
                return text
            matches = [choice for choice in self.choices if choice.lower() == text.lower()]
            if not matches:
                raise ValueError(self.expected())
            return matches[0]
        try:
            number = self.kind(text)
        except ValueError:
            raise ValueError(self.expected()) from None
        if not math.isfinite(number) or (self.choices and number not in self.choices):
            raise ValueError(self.expected())
        return number


def declared_options(cls: type) -> list[DeclaredOption]:
    """The options a dataclass declares, in field order; TypeError for a field that is not an ``option()``
    of a supported type."""
    try:
        hints = typing.get_type_hints(cls)
    except NameError as error:  # string annotations naming what the class's module does not define
        raise TypeError(f"{cls.__qualname__}: cannot read the type of an option ({error})") from None
    found = []
    for field in dataclasses.fields(cls):
        declaration = field.metadata.get(_DECLARATION)
        if declaration is None:
            raise TypeError(f"{cls.__qualname__}.{field.name} is not declared with option(default, doc=...)")
        kind, choices = _kind_of(hints[field.name], f"{cls.__qualname__}.{field.name}")
        found.append(DeclaredOption(field.name, declaration.key or field.name.replace("_", "-"), kind, choices,
                                    field.default, declaration.doc, declaration.minimum, declaration.check))
    return found


def _kind_of(hint: Any, where: str) -> tuple[type, tuple[Any, ...]]:
    """(kind, choices) of an option's annotation; ``X | None`` is read as ``X``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        hint = rest[0] if len(rest) == 1 else hint
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        kinds = {type(choice) for choice in choices}
        if len(kinds) == 1 and kinds <= {int, str}:
            return kinds.pop(), choices
    elif hint in (bool, int, float, str):
        return hint, ()
    raise TypeError(f"{where}: an option is a bool, int, float, str or Literal of ints or strs, optionally "
                    f"'| None'; not {hint}")


def parse_options(cls: type[T], values: Mapping[str, str], *, backend: str, source: str,
                  defaults: Mapping[str, Any] | None = None) -> T:
    """An instance of the options dataclass ``cls`` from text ``values`` by key. Keys it does not declare are
    ignored (as Triton does); fields without a value keep ``defaults[name]``, else their declared default.
    A bad value raises an INVALID_ARG ServerError naming ``backend``, ``source`` ("--backend-config option",
    "model 'm' parameter"), the key and the value."""
    given: dict[str, Any] = {}
    for declared in declared_options(cls):
        if declared.key in values:
            text = values[declared.key]
            try:
                given[declared.name] = declared.parse(text)
            except ValueError as error:
                raise ServerError(f"backend '{backend}': {source} '{declared.key}' has invalid value '{text}': "
                                  f"{error}") from None
        elif defaults is not None and declared.name in defaults:
            given[declared.name] = defaults[declared.name]
        elif declared.default is dataclasses.MISSING:
            raise ServerError(f"backend '{backend}': {source} '{declared.key}' is required")
    return cls(**given)


def backend_options(backend: type[Backend], settings: Mapping[str, str]) -> Any:
    """A backend class's ``Options`` from its ``--backend-config`` settings (global ones included)."""
    return parse_options(backend.Options, settings, backend=backend.name, source="--backend-config option")


def model_parameters(backend: Backend, model: ModelSpec) -> Any:
    """The backend's ``Parameters`` from the model config's ``parameters``. A field that the backend's
    ``Options`` also declares defaults to the backend's value: the model's parameter overrides the
    server-wide option for that model."""
    values = {key: value.string_value for key, value in model.config.parameters.items()}
    server_wide = {field.name: getattr(backend.options, field.name) for field in dataclasses.fields(backend.options)}
    return parse_options(type(backend).Parameters, values, backend=backend.name,
                         source=f"model '{model.name}' parameter", defaults=server_wide)


def describe_options(backend: type[Backend]) -> list[str]:
    """What ``triton-serve plugins`` prints under a backend: each option and parameter with its type,
    default and doc, grouped by where it is set."""
    lines = []
    for where, declaration in ((f"--backend-config={backend.name},<key>=<value>", backend.Options),
                               ("model config parameters { key: ... value { string_value: ... } }",
                                backend.Parameters)):
        declared = declared_options(declaration)
        if declared:
            lines.append(f"{where}:")
        for item in declared:
            lines += [f"    {item.key}: {item.type_text()}, {_default_text(item.default)}",
                      f"        {item.doc}"]
    return lines


def _default_text(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "required"
    if value is None:
        return "default not set"
    if isinstance(value, bool):
        return f"default {str(value).lower()}"
    return f"default '{value}'" if isinstance(value, str) else f"default {value}"
