"""What a cloud client provides: listing and downloading the objects of one bucket (or container)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path


class StoreError(Exception):
    """A request to the object store failed; the message says why (missing bucket, denied, unreachable...)."""


@dataclass(frozen=True)
class StoredObject:
    """One object: its key, its size, and a tag (etag, md5 or generation) that changes with its content."""

    key: str
    size: int
    tag: str


class ObjectStore(ABC):
    """A thin, blocking client of one bucket; the repository source calls it from worker threads.

    Keys are "/"-separated; a prefix is "" or ends with "/". Methods raise StoreError with a short
    reason for any failure of the service (the caller adds the repository location).
    """

    @abstractmethod
    def list_folders(self, prefix: str) -> list[str]:
        """The names of the "folders" directly under ``prefix`` (key segments followed by "/")."""

    @abstractmethod
    def list_objects(self, prefix: str) -> list[StoredObject]:
        """Every object whose key starts with ``prefix``, at any depth."""

    @abstractmethod
    def download(self, key: str, target: Path) -> None:
        """Write the object's content to the local file ``target`` (its folder exists)."""
