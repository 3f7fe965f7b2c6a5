"""Repository agents (Triton's repo-agent API): the ``model_repository_agents`` of a model's config, each told
of the model's load and unload in Triton's order, each able to check the files or put them somewhere else."""
from __future__ import annotations

import asyncio
import enum
import errno
import logging
import os
import shutil
import stat
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ServerError, Status
from .protos.model_config_pb2 import ModelConfig

log = logging.getLogger("triton_serve")

READ_CHUNK = 1 << 20  # bytes per read of AgentModel.read_file: what it holds in memory at once
# Flags of every open AgentModel.read_file makes: a symbolic link is never followed, a FIFO never waits for a writer.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class AgentAction(enum.Enum):
    """Triton's TRITONREPOAGENT_ActionType: what is happening to the model when an agent is called."""

    LOAD = "TRITONREPOAGENT_ACTION_LOAD"
    LOAD_COMPLETE = "TRITONREPOAGENT_ACTION_LOAD_COMPLETE"
    LOAD_FAIL = "TRITONREPOAGENT_ACTION_LOAD_FAIL"
    UNLOAD = "TRITONREPOAGENT_ACTION_UNLOAD"
    UNLOAD_COMPLETE = "TRITONREPOAGENT_ACTION_UNLOAD_COMPLETE"


@dataclass
class AgentModel:
    """One agent's view of one load of a model: its name, config and the agent's ``parameters`` from that
    config; ``location``, the directory the agent sees (the model's own, or what the agent before it set).
    ``state`` is the agent's own, kept from LOAD to UNLOAD_COMPLETE."""

    name: str
    config: ModelConfig
    parameters: dict[str, str]
    location: Path
    state: dict[str, Any] = field(default_factory=dict)
    _mutable: Path | None = None

    def set_location(self, location: Path) -> None:
        """During LOAD: serve the model from ``location`` instead (e.g. the decrypted copy an agent wrote);
        the agents after this one and the backend see it."""
        self.location = Path(location)

    def acquire_mutable_location(self) -> Path:
        """A fresh directory this agent may write into (Triton's AcquireMutableLocation), deleted after
        UNLOAD_COMPLETE or LOAD_FAIL; the same one on each call."""
        if self._mutable is None:
            self._mutable = Path(tempfile.mkdtemp(prefix=f"triton-serve-agent-{self.name}-"))
        return self._mutable

    def read_file(self, relative: str) -> Iterator[bytes]:
        """The bytes of the regular file at ``relative`` under ``location``, in chunks of at most ``READ_CHUNK``,
        up to the size the file had when opened (a generator: the checks run at the first chunk). Only a file
        inside ``location`` is read: a path that leads outside it (``..``, an absolute path, a symbolic link
        out) or to anything but a regular file (a FIFO, a device, a directory) raises OSError before the file is
        opened for reading, its message saying which, never what is there."""
        fd = _open_inside(self.location, relative)
        with os.fdopen(fd, "rb", buffering=0) as file:
            left = os.fstat(file.fileno()).st_size
            while left > 0:
                chunk = file.read(min(READ_CHUNK, left))
                if not chunk:
                    break
                left -= len(chunk)
                yield chunk

    def delete_mutable_location(self) -> None:
        """Delete the directory ``acquire_mutable_location`` made (the core calls this after UNLOAD_COMPLETE
        or LOAD_FAIL; an agent may call it sooner)."""
        if self._mutable is not None:
            shutil.rmtree(self._mutable, ignore_errors=True)
            self._mutable = None


def _open_inside(root: Path, relative: str) -> int:
    """A read-only descriptor of the regular file ``relative`` names under ``root`` (see ``AgentModel.read_file``).
    The path is resolved first (a link that stays inside ``root`` is fine) and must end inside ``root``; the
    resolved path is then opened one directory at a time without following links, so a link put in its way
    meanwhile is refused rather than followed out."""
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, relative))
    if target == base or os.path.commonpath([base, target]) != base:
        raise OSError(errno.EACCES, "the path leads outside the model's directory")
    *folders, name = Path(target).relative_to(base).parts
    directory = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for folder in folders:
            inner = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            os.close(directory)
            directory = inner
        found = os.stat(name, dir_fd=directory, follow_symlinks=False)
        if not stat.S_ISREG(found.st_mode):  # a FIFO or device is never opened: opening may wait or act
            raise OSError(errno.EINVAL, "not a regular file")
        fd = os.open(name, _OPEN_FLAGS, dir_fd=directory)
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino):
            os.close(fd)
            raise OSError(errno.EAGAIN, "the file changed while it was opened")
        return fd
    finally:
        os.close(directory)


class RepositoryAgent(ABC):
    """A repository agent, registered by name through ``tserve_register_repository_agents``; a model's
    ``model_repository_agents { agents [{ name: "<name>" ... }] }`` picks it.

    ``model_action`` runs in a worker thread (it may block on file I/O), once per action of each model that
    names the agent, never twice at once for one model. Raising (a ServerError for a clear message) during
    LOAD fails the load; raising on other actions is logged, as Triton does.
    """

    @abstractmethod
    def model_action(self, model: AgentModel, action: AgentAction) -> None:
        """Act on ``model`` for ``action``: check or rewrite its files during LOAD (``model.set_location``,
        ``model.acquire_mutable_location``), clean up on LOAD_FAIL or UNLOAD_COMPLETE."""


AgentFactory = Callable[[], RepositoryAgent]


class AgentChain:
    """The agents of one load of one model, in their config's order, through Triton's life cycle:
    ``load()`` (LOAD, in order), then ``load_complete()`` or ``load_fail()`` (in reverse), and later
    ``unload()`` (UNLOAD in order, then UNLOAD_COMPLETE in reverse)."""

    def __init__(self, models: list[tuple[RepositoryAgent, AgentModel]]) -> None:
        self._models = models
        self._loaded: list[tuple[RepositoryAgent, AgentModel]] = []
        self.completed = False

    @property
    def location(self) -> Path:
        """Where the model's files are for the backend: the last agent's location."""
        return self._models[-1][1].location

    async def load(self, model_name: str, location: Path, failed: str) -> Path:
        """LOAD each agent in order, each seeing the location the one before it left; the model's files'
        location after the last. An agent's error becomes ``<failed>: <message>`` and the agents already
        called get LOAD_FAIL."""
        for agent, model in self._models:
            model.location = location
            try:
                await asyncio.to_thread(agent.model_action, model, AgentAction.LOAD)
            except Exception as error:
                self._loaded.append((agent, model))  # it saw LOAD: it hears LOAD_FAIL too
                await self.load_fail()
                message = error.message if isinstance(error, ServerError) else str(error)
                status = error.status if isinstance(error, ServerError) else Status.INVALID_ARG
                raise ServerError(f"{failed}: {message}", status) from None
            self._loaded.append((agent, model))
            location = model.location
        return location

    async def load_complete(self) -> None:
        self.completed = True
        await self._each(reversed(self._loaded), AgentAction.LOAD_COMPLETE)

    async def load_fail(self) -> None:
        await self._each(reversed(self._loaded), AgentAction.LOAD_FAIL)
        self._release()

    async def unload(self) -> None:
        if not self.completed:
            return
        self.completed = False
        await self._each(iter(self._loaded), AgentAction.UNLOAD)
        await self._each(reversed(self._loaded), AgentAction.UNLOAD_COMPLETE)
        self._release()

    async def _each(self, models: Any, action: AgentAction) -> None:
        for agent, model in list(models):
            try:
                await asyncio.to_thread(agent.model_action, model, action)
            except Exception as error:  # only LOAD may fail a load; Triton logs the rest
                log.error("Agent model returns error on %s: %s", action.value,
                          error.message if isinstance(error, ServerError) else error)

    def _release(self) -> None:
        for _agent, model in self._loaded:
            model.delete_mutable_location()
        self._loaded = []


def agent_chain(name: str, config: ModelConfig, factories: Callable[[str], AgentFactory | None],
                location: Path, installed: list[str]) -> AgentChain | None:
    """The chain of agents ``config`` names, or None where it names none; an agent no plugin provides is an
    INVALID_ARG error naming it."""
    agents = config.model_repository_agents.agents
    if not agents:
        return None
    models = []
    for agent_config in agents:
        factory = factories(agent_config.name)
        if factory is None:
            raise ServerError(f"unable to find repository agent '{agent_config.name}' for model '{name}': no "
                              f"installed plugin provides it (installed: {', '.join(installed) or 'none'})",
                              Status.INVALID_ARG)
        try:
            agent = factory()
        except Exception as error:  # a plugin's bug: the load fails, naming the agent
            raise ServerError(f"repository agent '{agent_config.name}' could not be created: "
                              f"{type(error).__name__}: {error}", Status.INTERNAL) from None
        models.append((agent, AgentModel(name, config, dict(agent_config.parameters), location)))
    return AgentChain(models)
