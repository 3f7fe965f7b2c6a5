"""The repository-source API: where model directories come from (local paths, object stores...)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from pathlib import Path


class RepositorySource(ABC):
    """One ``--model-repository`` location: lists its models and gives a local directory for each.

    Every method is a coroutine called on the server's event loop: a source that does blocking
    work (network, large directory walks) runs it in a thread (``asyncio.to_thread``).
    """

    def __init__(self, location: str) -> None:
        self.location = location

    @property
    def name(self) -> str:
        """The repository's name in ``/v2/repository/{name}/...`` routes: its last path segment."""
        return self.location.rstrip("/").rsplit("/", 1)[-1]

    @abstractmethod
    async def list_models(self) -> list[str]:
        """Names of the model directories in this repository."""

    @abstractmethod
    async def exists(self, name: str) -> bool:
        """Whether this repository holds a model directory ``name`` (without downloading it)."""

    @abstractmethod
    async def versions(self, name: str) -> list[int]:
        """The model's numeric version folders, ascending (names with a leading zero or non-digits
        are not versions, as in Triton)."""

    @abstractmethod
    async def model_dir(self, name: str, versions: Collection[int] | None = None) -> Path:
        """A local directory holding ``<name>``'s config and other files, and at least the version
        folders in ``versions`` (every one when None). A remote source downloads what is missing or
        changed since the last call. Raises FileNotFoundError if the model is absent."""

    @abstractmethod
    async def fingerprint(self, name: str) -> str:
        """A value that changes whenever any file of the model changes (poll mode compares it)."""


def is_version_name(name: str) -> bool:
    """A folder name that is a model version: digits without a leading zero."""
    return name.isdigit() and not name.startswith("0")
