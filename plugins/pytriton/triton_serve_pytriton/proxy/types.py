"""The request an undecorated inference function receives (``pytriton.proxy.types``)."""
from __future__ import annotations

import dataclasses
from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from typing import Any

import numpy as np


@dataclasses.dataclass
class Request:
    """One inference request: its inputs by name (``request["a"]``, a mapping), its ``parameters``
    (the request's parameters and forwarded headers) and the outputs its client asked for."""

    data: dict[str, np.ndarray]
    parameters: dict[str, Any] | None = None
    span: Any = None
    requested_output_names: list[str] | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        return self.data[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.data[name] = value

    def __delitem__(self, name: str) -> None:
        del self.data[name]

    def __contains__(self, name: object) -> bool:
        return name in self.data

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def items(self) -> ItemsView[str, np.ndarray]:
        """The inputs' names and arrays."""
        return self.data.items()

    def keys(self) -> KeysView[str]:
        """The inputs' names."""
        return self.data.keys()

    def values(self) -> ValuesView[np.ndarray]:
        """The inputs' arrays."""
        return self.data.values()


Requests = list[Request]
