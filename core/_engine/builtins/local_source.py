"""Built-in repository source for model repositories on the local filesystem."""
from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Collection
from pathlib import Path

from ..errors import ServerError, Status
from ..hookspecs import hookimpl
from ..sources import RepositorySource, is_version_name


class LocalRepositorySource(RepositorySource):
    """A directory whose sub-directories are models (``<repo>/<model>/config.pbtxt``)."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.root = Path(location.removeprefix("file://")).expanduser().resolve()

    @property
    def name(self) -> str:
        return self.root.name

    async def list_models(self) -> list[str]:
        try:
            entries = list(self.root.iterdir())
        except OSError as error:  # missing, not a directory, or not readable
            raise ServerError(f"cannot list model repository '{self.location}': {error.strerror or error}",
                              Status.INTERNAL) from None
        return sorted(p.name for p in entries if p.is_dir() and not p.name.startswith("."))

    async def exists(self, name: str) -> bool:
        return (self.root / name).is_dir()

    async def versions(self, name: str) -> list[int]:
        path = await self.model_dir(name)
        return sorted(int(p.name) for p in path.iterdir() if p.is_dir() and is_version_name(p.name))

    async def model_dir(self, name: str, versions: Collection[int] | None = None) -> Path:
        path = self.root / name
        if not path.is_dir():
            raise FileNotFoundError(f"no model directory '{name}' in repository '{self.location}'")
        return path

    async def fingerprint(self, name: str) -> str:
        return await asyncio.to_thread(_tree_fingerprint, await self.model_dir(name))


def _tree_fingerprint(root: Path) -> str:
    """A hash of every file's relative path, size and modification time under ``root``."""
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for file in sorted(files):
            path = os.path.join(folder, file)
            try:
                stat = os.stat(path)
            except FileNotFoundError:  # removed while walking: the next poll sees the change
                continue
            digest.update(f"{os.path.relpath(path, root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@hookimpl
def tserve_repository_source(location: str) -> RepositorySource | None:
    if "://" in location and not location.startswith("file://"):
        return None
    return LocalRepositorySource(location)
