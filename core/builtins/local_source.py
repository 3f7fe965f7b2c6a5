"""Built-in repository source for model repositories on the local filesystem."""
from __future__ import annotations

from pathlib import Path

from ..hookspecs import hookimpl
from ..sources import RepositorySource


class LocalRepositorySource(RepositorySource):
    """A directory whose sub-directories are models (``<repo>/<model>/config.pbtxt``)."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.root = Path(location.removeprefix("file://")).expanduser().resolve()

    def list_models(self) -> list[str]:
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository '{self.location}' is not a directory")
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def model_dir(self, name: str) -> Path:
        path = self.root / name
        if not path.is_dir():
            raise FileNotFoundError(f"no model directory '{name}' in repository '{self.location}'")
        return path


@hookimpl
def tserve_repository_source(location: str) -> RepositorySource | None:
    if "://" in location and not location.startswith("file://"):
        return None
    return LocalRepositorySource(location)
