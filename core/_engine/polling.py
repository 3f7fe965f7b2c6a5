"""Poll mode (``--model-control-mode=poll``): follow the model repositories' changes while serving."""
from __future__ import annotations

import asyncio
import logging

from .errors import ServerError
from .repository import ModelRepository

log = logging.getLogger(__name__)


class RepositoryPoller:
    """Every ``interval_s`` seconds, loads the models added to the repositories, reloads the changed
    ones (zero-downtime: a broken change leaves the serving versions serving) and unloads the removed
    ones. ``start()`` begins polling on the running loop; ``await stop()`` lets a poll in progress
    finish, then ends it."""

    def __init__(self, repository: ModelRepository, interval_s: float) -> None:
        self.repository = repository
        self.interval_s = interval_s
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stopping.wait(), self.interval_s)
                return
            except asyncio.TimeoutError:
                pass
            try:
                await self.poll()
            except Exception:  # a poll that fails is logged; the next one tries again
                log.exception("failed to poll the model repositories")

    async def poll(self) -> None:
        """One pass: compare the repositories with what is loaded and apply the differences."""
        repository = self.repository
        names = set(await repository.model_names())
        removed = await repository.departed(names)
        candidates = sorted(names)
        changed = await asyncio.gather(*(repository.is_changed(name) for name in candidates))
        to_load = [name for name, is_changed in zip(candidates, changed) if is_changed]
        for name in removed:
            log.info("poll: model '%s' left the repository; unloading it", name)
        for name in to_load:
            log.info("poll: model '%s' is %s", name, "changed; reloading it" if name in repository.models
                     else "new; loading it")
        await asyncio.gather(*(repository.remove(name) for name in removed),
                             *(self._load(name) for name in to_load))

    async def _load(self, name: str) -> None:
        try:
            await self.repository.load(name)
        except ServerError as error:  # e.g. removed again since the listing
            log.error("poll: cannot load model '%s': %s", name, error.message)
