"""Mirroring a model's objects into a local cache directory, downloading only what is missing or changed."""
from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Collection
from pathlib import Path, PurePosixPath

from triton_serve.plugin import is_version_name

from .cache_dir import CacheDirectory
from .store import ObjectStore, StoredObject, StoreError

log = logging.getLogger(__name__)


def relative_path(key: str, model_prefix: str) -> PurePosixPath | None:
    """``key`` below ``model_prefix`` as a safe relative path; None for the folder markers that some
    tools write (keys ending with "/"). Raises StoreError for a key that would leave the folder."""
    relative = key[len(model_prefix):]
    if not relative or relative.endswith("/"):
        return None
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise StoreError(f"object '{key}' has a key that is not a plain relative path")
    return PurePosixPath(*parts)


def is_wanted(path: PurePosixPath, versions: Collection[int] | None) -> bool:
    """Whether a model's file belongs to its config and other files, or to one of ``versions`` (all when None)."""
    if len(path.parts) == 1 or not is_version_name(path.parts[0]):
        return True
    return versions is None or int(path.parts[0]) in versions


class ModelCache:
    """Local copies of one repository's models, in its cache directory ``<root>``.

    ``<root>/models/<name>/`` is what backends read; ``<root>/manifests/<name>.json`` records each
    downloaded file's size and tag, so a later sync downloads only objects whose size or tag changed
    and deletes the files whose objects are gone. Files the cache did not write (``__pycache__``) stay.
    """

    def __init__(self, directory: CacheDirectory) -> None:
        self.directory = directory

    @property
    def root(self) -> Path:
        return self.directory.path

    def model_dir(self, name: str) -> Path:
        return self.root / "models" / name

    def _manifest_path(self, name: str) -> Path:
        return self.root / "manifests" / f"{name}.json"

    def _read_manifest(self, name: str) -> dict[str, list[object]]:
        try:
            manifest = json.loads(self._manifest_path(name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return manifest if isinstance(manifest, dict) else {}

    def _write_manifest(self, name: str, manifest: dict[str, list[object]]) -> None:
        path = self._manifest_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps(manifest, sort_keys=True), encoding="utf-8")
        os.replace(partial, path)

    def sync(self, store: ObjectStore, name: str, model_prefix: str, objects: list[StoredObject],
             versions: Collection[int] | None) -> Path:
        """Bring ``<root>/models/<name>`` up to date with ``objects`` (every object under ``model_prefix``):
        download the wanted ones that are missing or changed, delete files whose object is gone.
        Blocking: call it from a worker thread. Returns the model directory."""
        model_dir = self.model_dir(name)
        model_dir.mkdir(parents=True, exist_ok=True)
        manifest = self._read_manifest(name)
        remote: set[str] = set()
        downloaded = 0
        for stored in objects:
            path = relative_path(stored.key, model_prefix)
            if path is None:
                self._make_marked_folder(model_dir, stored.key[len(model_prefix):], versions)
                continue
            remote.add(str(path))
            if not is_wanted(path, versions):
                continue
            local = model_dir.joinpath(*path.parts)
            record: list[object] = [stored.size, stored.tag]
            if manifest.get(str(path)) == record and local.is_file() and local.stat().st_size == stored.size:
                continue
            self._download(store, stored.key, local)
            manifest[str(path)] = record
            downloaded += 1
        for gone in set(manifest) - remote:
            _remove(model_dir, PurePosixPath(gone))
            del manifest[gone]
        self._write_manifest(name, manifest)
        if downloaded:
            log.info("model '%s': downloaded %d changed or missing file(s) into %s", name, downloaded, model_dir)
        return model_dir

    def _make_marked_folder(self, model_dir: Path, relative: str, versions: Collection[int] | None) -> None:
        """Create the folder a "<folder>/" marker object stands for, when it is wanted (empty version folders)."""
        parts = [part for part in relative.split("/") if part]
        if parts and ".." not in parts and is_wanted(PurePosixPath(*parts, "marker"), versions):
            model_dir.joinpath(*parts).mkdir(parents=True, exist_ok=True)

    def _download(self, store: ObjectStore, key: str, local: Path) -> None:
        """Download into the cache's scratch folder, then move into place: readers never see half a file."""
        scratch = self.root / "partial"
        scratch.mkdir(parents=True, exist_ok=True)
        partial = scratch / uuid.uuid4().hex
        try:
            store.download(key, partial)
            local.parent.mkdir(parents=True, exist_ok=True)
            os.replace(partial, local)
        finally:
            partial.unlink(missing_ok=True)


def _remove(model_dir: Path, path: PurePosixPath) -> None:
    """Delete a model's file, then its folders that this leaves empty (a version folder whose objects are gone)."""
    local = model_dir.joinpath(*path.parts)
    local.unlink(missing_ok=True)
    for folder in local.parents:
        if folder == model_dir or any(folder.iterdir()):
            break
        folder.rmdir()
