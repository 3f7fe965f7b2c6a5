"""The repository source for object stores: lists models remotely, mirrors each into the local cache."""
from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TypeVar

from triton_serve.plugin import RepositorySource, ServerError, Status, is_version_name

from .cache_dir import CacheDirectory
from .locations import ObjectLocation
from .store import ObjectStore, StoredObject, StoreError
from .sync import ModelCache

T = TypeVar("T")


class ObjectStoreRepositorySource(RepositorySource):
    """A model repository under a bucket prefix (``s3://``, ``gs://``, ``as://``).

    Listing and change detection read the store only; ``model_dir`` copies the model's config, its
    other files and the asked-for version folders into the cache, downloading what is missing or changed.
    Store calls block, so they run in worker threads.
    """

    def __init__(self, where: ObjectLocation, store: ObjectStore, cache: ModelCache) -> None:
        super().__init__(where.location)
        self.where = where
        self.store = store
        self.cache = cache

    @classmethod
    def create(cls, scheme: str, where: ObjectLocation, store: ObjectStore) -> ObjectStoreRepositorySource:
        """A source whose cache directory follows the environment (see ``cache_dir``)."""
        return cls(where, store, ModelCache(CacheDirectory(scheme, where.location, where.name)))

    @property
    def name(self) -> str:
        return self.where.name

    async def _call(self, what: str, call: Callable[..., T], *args: object) -> T:
        """Run a blocking store call in a thread; a store failure becomes an error naming the location."""
        try:
            return await asyncio.to_thread(call, *args)
        except StoreError as error:
            raise ServerError(f"{what} model repository '{self.location}': {error}", Status.UNAVAILABLE) from None

    async def list_models(self) -> list[str]:
        folders = await self._call("cannot list", self.store.list_folders, self.where.prefix)
        return sorted(name for name in folders if not name.startswith("."))

    async def exists(self, name: str) -> bool:
        return name in await self.list_models()

    async def versions(self, name: str) -> list[int]:
        folders = await self._call(f"cannot list model '{name}' in", self.store.list_folders, self._model_prefix(name))
        return sorted(int(folder) for folder in folders if is_version_name(folder))

    async def model_dir(self, name: str, versions: Collection[int] | None = None) -> Path:
        objects = await self._objects(name)
        if not objects:
            raise FileNotFoundError(f"no model directory '{name}' in repository '{self.location}'")
        return await self._call(f"cannot download model '{name}' from", self.cache.sync, self.store, name,
                                self._model_prefix(name), objects, None if versions is None else set(versions))

    async def fingerprint(self, name: str) -> str:
        digest = hashlib.sha256()
        for stored in sorted(await self._objects(name), key=lambda o: o.key):
            digest.update(f"{stored.key}\0{stored.size}\0{stored.tag}\n".encode())
        return digest.hexdigest()

    async def _objects(self, name: str) -> list[StoredObject]:
        return await self._call(f"cannot list model '{name}' in", self.store.list_objects, self._model_prefix(name))

    def _model_prefix(self, name: str) -> str:
        return f"{self.where.prefix}{name}/"
