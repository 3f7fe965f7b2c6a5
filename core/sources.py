"""The repository-source API: where model directories come from (local paths, object stores...)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path


class RepositorySource(ABC):
    """One ``--model-repository`` location. Lists models and gives a local directory for each."""

    def __init__(self, location: str) -> None:
        self.location = location

    @abstractmethod
    def list_models(self) -> list[str]:
        """Names of the model directories in this repository."""

    @abstractmethod
    def model_dir(self, name: str) -> Path:
        """A local directory holding ``<name>/config.pbtxt`` and its version folders
        (download it first if the source is remote). Raise FileNotFoundError if absent."""
