"""Where a cloud repository's models are copied: a configured folder, else a temporary one per server."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import weakref
from pathlib import Path

CACHE_ENV = "TRITON_SERVE_MODEL_CACHE"
# Triton's per-cloud variables; each wins over CACHE_ENV for its own cloud.
TRITON_MOUNT_ENV = {"s3": "TRITON_AWS_MOUNT_DIRECTORY", "gs": "TRITON_GCS_MOUNT_DIRECTORY",
                    "as": "TRITON_AZURE_MOUNT_DIRECTORY"}


class CacheDirectory:
    """The local folder for one repository location, created on first use.

    Under a configured folder it is ``<folder>/<repository name>-<hash of the location>``, kept across
    restarts so unchanged files are not downloaded again; otherwise a new temporary folder that is
    deleted when the server (the process that made it) exits.
    """

    def __init__(self, scheme: str, location: str, name: str) -> None:
        self.scheme = scheme
        self.location = location
        self.name = name
        self._path: Path | None = None

    @property
    def configured_root(self) -> str:
        """The folder the environment names for this cloud's caches, or ""."""
        return os.environ.get(TRITON_MOUNT_ENV[self.scheme]) or os.environ.get(CACHE_ENV, "")

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = self._create()
        return self._path

    def _create(self) -> Path:
        root = self.configured_root
        if root:
            digest = hashlib.sha256(self.location.encode()).hexdigest()[:12]
            path = Path(root).expanduser() / f"{self.name}-{digest}"
            path.mkdir(parents=True, exist_ok=True)
            return path
        path = Path(tempfile.mkdtemp(prefix=f"triton-serve-{self.scheme}-"))
        weakref.finalize(self, _remove_if_owner, path, os.getpid())
        return path


def _remove_if_owner(path: Path, owner_pid: int) -> None:
    """Delete a temporary cache, unless this is a forked child that inherited the finalizer."""
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)
