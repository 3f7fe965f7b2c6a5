"""The model repository: finds models in every source, loads and unloads them, tracks version states."""
from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from .backend import Backend, InstanceSpec, ModelInstance, ModelSpec
from .backend import Model as BackendModel
from .client import InferenceClient
from .config_preparation import POLL_FAILED, ConfigPreparer, copy_config
from .devices import visible_gpu_ids
from .errors import ServerError, not_found, unavailable
from .load_overrides import LoadOverride, remove_model_dir
from .options import model_parameters
from .pluginhost import PluginHost
from .protos.model_config_pb2 import ModelConfig, ModelInstanceGroup
from .ratelimit import RateLimiter
from .repo_agents import AgentChain, agent_chain
from .route import ModelRoute
from .scheduling import InstancePool, ModelContext, Scheduler
from .sources import RepositorySource
from .statistics import LatencySettings, ModelStats, model_latency_settings
from .warmup import warm_up, warmup_samples

log = logging.getLogger(__name__)


class VersionState(str, enum.Enum):
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass
class ModelVersion:
    """One version of a model: its state, and once READY its backend's Model, instances and scheduler."""

    spec: ModelSpec
    state: VersionState = VersionState.LOADING
    reason: str = ""
    model: BackendModel | None = None  # None for an ensemble, and before it loads or after it unloads
    instances: list[ModelInstance] = field(default_factory=list)
    scheduler: Scheduler | None = None
    labels: dict[str, list[str]] = field(default_factory=dict)
    stats: ModelStats = field(default_factory=ModelStats)

    @property
    def version(self) -> int:
        return self.spec.version

    @property
    def config(self) -> ModelConfig:
        return self.spec.config

    @functools.cached_property
    def route(self) -> ModelRoute:
        """What every request needs, resolved once (the config is final once the version serves)."""
        return ModelRoute(self.spec.name, self.spec.config, self.labels)

    def is_ready(self) -> bool:
        """Loaded, with at least one instance able to serve (the pool routes around the others)."""
        if self.state is not VersionState.READY:
            return False
        for instance in self.instances:
            if instance.is_ready():
                return True
        return not self.instances

    async def check_ready(self) -> bool:
        """``is_ready()``, and the own check of every instance that can serve (Triton's model-ready endpoint asks
        every instance; an instance that is down is routed around here, as ``is_ready()`` says)."""
        if not self.is_ready():
            return False
        answers = await asyncio.gather(*(instance.check_ready() for instance in self.instances if instance.is_ready()),
                                       return_exceptions=True)
        return all(answer is True for answer in answers)

    def not_ready_reason(self) -> str:
        """Why a loaded version cannot serve right now (its instances are down), or its load failure."""
        if self.state is VersionState.READY:
            return "; ".join(i.not_ready_reason() for i in self.instances if not i.is_ready())
        return self.reason


@dataclass
class Model:
    """Everything known about one model name: its versions, or why it could not load at all."""

    name: str
    key: str = ""  # its key in ModelRepository.models: the name, or '<repository>::<name>' (namespaced)
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    error: str = ""
    wanted: bool = True  # False after an explicit unload: not counted for server readiness
    source: RepositorySource | None = None  # where it was loaded from; None: a load's override files
    fingerprint: str = ""  # the source's fingerprint when this load read it (poll mode compares it)
    private_dir: Path | None = None  # the override files' directory, removed when this record retires
    reload_error: str = ""  # why the last reload failed while these versions kept serving
    agents: AgentChain | None = None  # this load's model_repository_agents, told of its load and unload

    def __post_init__(self) -> None:
        self.key = self.key or self.name

    def latest_ready(self) -> ModelVersion | None:
        latest = None
        for found in self.versions.values():
            if (latest is None or found.version > latest.version) and found.is_ready():
                latest = found
        return latest

    def is_ready(self) -> bool:
        return not self.error and bool(self.versions) and all(v.is_ready() for v in self.versions.values())

    def failure(self) -> str:
        """Why this load failed, in Triton's words ("" when every version loaded)."""
        if self.error:
            return self.error
        failed = [v for v in sorted(self.versions.values(), key=lambda v: v.version)
                  if v.state is not VersionState.READY]
        if not failed:
            return ""
        return f"load failed for model '{self.name}': " + "".join(
            f"version {v.version} is at {v.state.value} state: {v.reason};" for v in failed)

    def is_serving(self) -> bool:
        """Some version is loaded (a reload must not take it away unless the new one loads)."""
        return any(v.state is VersionState.READY for v in self.versions.values())


@dataclass
class RepositoryOptions:
    """Flags that change how models load (Triton's names)."""

    strict_model_config: bool = False
    disable_auto_complete_config: bool = False
    model_config_name: str = ""
    drain_timeout_s: float = 30.0  # how long unload waits for in-flight requests before unloading anyway
    rate_limiter: RateLimiter | None = None  # shared by every model; None: no rate limiting
    latency: LatencySettings | None = None  # per-request latency distributions (--metrics-config); None: none
    model_namespacing: bool = False  # --model-namespacing: each repository's models keyed apart


def namespaced(namespace: str, name: str) -> str:
    """The key of model ``name`` of the repository at ``namespace`` under --model-namespacing, as Triton
    writes a model identifier ('<namespace>::<name>'); no namespace: the name. An ensemble step whose
    ``model_namespace`` is set reaches its model by this key."""
    return f"{namespace}::{name}" if namespace else name


class ModelRepository:
    """The one place that owns model lifecycle: index, load, unload, look-up for requests."""

    def __init__(self, sources: list[RepositorySource], plugins: PluginHost,
                 options: RepositoryOptions | None = None) -> None:
        self.sources = sources
        self.plugins = plugins
        self.options = options or RepositoryOptions()
        self.models: dict[str, Model] = {}  # by key: the name, or namespaced(location, name)
        self.namespacing = self.options.model_namespacing
        self._keys: dict[str, set[str]] = {}  # namespacing: name -> the keys of its records
        # Requests from models and schedulers to other models (the data plane binds it).
        self.client = InferenceClient(configs=lambda name, version: self.get_version(name, version).config)
        auto_complete = not (self.options.strict_model_config or self.options.disable_auto_complete_config)
        self.preparer = ConfigPreparer(plugins, self.client, auto_complete=auto_complete,
                                       config_name=self.options.model_config_name)
        self._locks: dict[str, asyncio.Lock] = {}
        self._dependencies: dict[str, frozenset[str]] = {}
        self._awaiting: dict[str, frozenset[str]] = {}  # ensembles loading -> the models they wait for
        self._explicit: set[str] = set()  # models a load asked for (not only loaded for an ensemble)

    # ---- discovery ------------------------------------------------------------------------

    def sources_named(self, repository: str) -> list[RepositorySource]:
        """The sources a ``/v2/repository/{repository}/...`` route names (every one for ""); an
        unknown name is a NOT_FOUND error."""
        if not repository:
            return self.sources
        named = [source for source in self.sources if source.name == repository]
        if not named:
            raise not_found(f"model repository '{repository}' not found; the repositories are: "
                            + ", ".join(f"'{source.name}'" for source in self.sources))
        return named

    async def model_names(self, sources: list[RepositorySource] | None = None) -> list[str]:
        """Every model directory across all repositories (or across ``sources``)."""
        listed = await asyncio.gather(*(source.list_models() for source in sources or self.sources))
        return sorted({name for names in listed for name in names})

    async def _holding(self, name: str, sources: list[RepositorySource]) -> list[RepositorySource]:
        """Those of ``sources`` that hold a model directory ``name``."""
        held = await asyncio.gather(*(source.exists(name) for source in sources))
        return [source for source, holds in zip(sources, held) if holds]

    async def _locate(self, name: str, sources: list[RepositorySource] | None = None) -> list[RepositorySource]:
        """The sources holding ``name``; an unknown model is an error."""
        found = await self._holding(name, sources or self.sources)
        if not found:
            raise ServerError(POLL_FAILED.format(name=name))
        return found

    async def _fingerprint(self, name: str, sources: list[RepositorySource]) -> str:
        """The fingerprints of ``name`` in each of ``sources``; "" when one cannot be read (which
        counts as a change)."""
        try:
            prints = await asyncio.gather(*(source.fingerprint(name) for source in sources))
        except OSError as error:
            log.warning("cannot fingerprint model '%s': %s", name, error)
            return ""
        return "\n".join(f"{source.location}={value}" for source, value in zip(sources, prints))

    async def is_changed(self, name: str) -> bool:
        """Whether ``name``'s files differ from those its current record was loaded from (poll mode)."""
        if self.namespacing:
            found = await self._holding(name, self.sources)
            records = [self.models.get(self._key(source, name)) for source in found]
            prints = [await self._fingerprint(name, [source]) for source in found]
            return not found or any(m is None or p != m.fingerprint for m, p in zip(records, prints))
        model = self.models.get(name)
        if model is None:
            return True
        found = await self._holding(name, self.sources)
        return not found or await self._fingerprint(name, found) != model.fingerprint

    def _key(self, source: RepositorySource, name: str) -> str:
        return namespaced(source.location, name) if self.namespacing else name

    def _put(self, model: Model) -> None:
        self.models[model.key] = model
        if self.namespacing:
            self._keys.setdefault(model.name, set()).add(model.key)

    def _pop(self, key: str) -> Model | None:
        model = self.models.pop(key, None)
        if model is not None and self.namespacing:
            self._keys.get(model.name, set()).discard(model.key)
        return model

    def resolve(self, name: str) -> str:
        """The key of the record a request's model name means: the name itself (or a namespaced key), or under
        --model-namespacing the one record of that name; a name several repositories hold is ambiguous
        (Triton's INVALID_ARG). An unknown name is returned as it is."""
        if name in self.models or not self.namespacing:
            return name
        keys = self._keys.get(name, ())
        if len(keys) > 1:
            raise ServerError(f"There are {len(keys)} identifiers of model '{name}' in global map, model "
                              "namespace must be provided to resolve ambiguity.")
        return next(iter(keys), name)

    def record(self, name: str) -> Model:
        """The record of the model a request names (``get_version`` found it)."""
        return self.models[self.resolve(name)]

    async def departed(self, names: Collection[str]) -> list[str]:
        """Poll mode: the keys of the records whose model left the repositories (``names``: the models they
        hold now); under --model-namespacing also those whose own repository no longer holds it."""
        gone = [key for key, model in self.models.items() if model.name not in names]
        if self.namespacing:
            kept = [model for model in self.models.values() if model.name in names and model.source is not None]
            held = await asyncio.gather(*(model.source.exists(model.name) for model in kept if model.source))
            gone += [model.key for model, there in zip(kept, held) if not there]
        return gone

    # ---- dependencies -----------------------------------------------------------------------

    def declare_dependencies(self, name: str, models: Collection[str]) -> None:
        """Record that model ``name`` uses ``models`` (an ensemble its steps); unloading one of them
        with ``unload_dependents`` also unloads ``name``. An empty ``models`` clears the record."""
        if models:
            self._dependencies[name] = frozenset(models)
        else:
            self._dependencies.pop(name, None)

    def dependents(self, name: str) -> list[str]:
        """The models that use ``name``, directly or through other models."""
        found: set[str] = set()
        pending = [name]
        while pending:
            used = pending.pop()
            for model, uses in self._dependencies.items():
                if used in uses and model not in found and model != name:
                    found.add(model)
                    pending.append(model)
        return sorted(found)

    # ---- look-up for requests ---------------------------------------------------------------

    def get_version(self, name: str, version: int | None = None) -> ModelVersion:
        """The version a request goes to (the latest READY one when ``version`` is None)."""
        model = self.models.get(name)
        if model is None and self.namespacing:
            model = self.models.get(self.resolve(name))
        if model is None or (not model.versions and not model.error):
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if version is None:
            latest = model.latest_ready()
            if latest is None:
                loaded = [v for v in model.versions.values() if v.state is VersionState.READY]
                if loaded:  # loaded, but an instance is down (e.g. restarting): retrying can succeed
                    newest = max(loaded, key=lambda v: v.version)
                    raise unavailable(f"model '{name}' version {newest.version} is not ready: "
                                      f"{newest.not_ready_reason()}")
                raise not_found(f"Request for unknown model: '{name}' has no available versions")
            return latest
        found = model.versions.get(version)
        if found is None:
            raise not_found(f"Request for unknown model: '{name}' version {version} is not found")
        if not found.is_ready():
            reason = found.not_ready_reason()
            raise unavailable(f"Request for unknown model: '{name}' version {version} is not at ready state"
                              + (f": {reason}" if reason else ""))
        return found

    def is_ready(self) -> bool:
        """Every model that should be loaded is ready (Triton's strict readiness)."""
        return all(model.is_ready() for model in self.models.values() if model.wanted)

    async def check_ready(self) -> bool:
        """``is_ready()``, and every version's own check (Triton 2.67's strict readiness asks each model)."""
        if not self.is_ready():
            return False
        versions = [v for model in self.models.values() if model.wanted for v in model.versions.values()]
        return all(await asyncio.gather(*(version.check_ready() for version in versions)))

    async def index(self, ready_only: bool = False, repository: str = "") -> list[dict[str, str]]:
        """Triton's repository index: one entry per model version, plus models never loaded; the
        models of the repositories named ``repository`` only, when given."""
        entries: list[dict[str, str]] = []
        if self.namespacing:  # one entry set per repository holding the name
            sources = self.sources_named(repository)
            listed = await asyncio.gather(*(source.list_models() for source in sources))
            keyed = sorted((name, self._key(source, name)) for source, names in zip(sources, listed) for name in names)
        else:
            keyed = [(name, name) for name in await self.model_names(self.sources_named(repository))]
        for name, key in keyed:
            model = self.models.get(key)
            if model is None:
                if not ready_only:
                    entries.append({"name": name})
                continue
            if model.error and not ready_only:
                entries.append({"name": name, "state": VersionState.UNAVAILABLE.value, "reason": model.error})
            for version in sorted(model.versions.values(), key=lambda v: v.version):
                state = version.state if version.state is not VersionState.READY or version.is_ready() \
                    else VersionState.UNAVAILABLE
                if ready_only and state is not VersionState.READY:
                    continue
                reason = version.not_ready_reason() if state is not VersionState.READY else _kept(model)
                entries.append({"name": name, "version": str(version.version), "state": state.value,
                                "reason": reason})
        return entries

    # ---- load and unload --------------------------------------------------------------------

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def load(self, name: str, override: LoadOverride | None = None, repository: str = "", *,
                   explicit: bool = True) -> Model:
        """Load or reload every version the policy selects, from the repositories named ``repository``
        (all for ""), or as ``override`` says. A reload loads beside the serving versions and switches
        once every new version is ready; if one fails, the serving versions stay and their record's
        ``reload_error`` says why. Loading a fully ready, unchanged model again does nothing, as in
        Triton. Returns this load's record, whose ``failure()`` says what failed; raises only for an
        unknown model or repository, or a name that is not one folder name (``check_model_name``).
        ``explicit`` is False when an ensemble loads the model it uses. Under --model-namespacing each
        repository holding ``name`` loads its own record; the one returned is the first that failed, if any."""
        check_model_name(name)
        if not self.namespacing or (override is not None and override.files):
            return await self._load(name, name, None, override, repository, explicit)
        sources = await self._locate(name, self.sources_named(repository))
        loaded = await asyncio.gather(*(self._load(self._key(source, name), name, [source], override, repository,
                                                   explicit) for source in sources))
        return next((model for model in loaded if model.failure()), loaded[0])

    async def _load(self, key: str, name: str, sources: list[RepositorySource] | None,
                    override: LoadOverride | None, repository: str, explicit: bool) -> Model:
        """``load`` of the record ``key`` (``sources``: where it is; None: find it)."""
        if explicit:
            self._explicit.add(key)
        async with self._lock(key):
            previous = self.models.get(key)
            if sources is None:
                sources = []
                if override is None or not override.files:
                    sources = await self._locate(name, self.sources_named(repository))
            fingerprint = await self._fingerprint(name, sources) if sources else ""
            if override is None and previous is not None and _unchanged(previous, fingerprint):
                return previous
            model = Model(name, key, source=sources[0] if len(sources) == 1 else None, fingerprint=fingerprint)
            try:
                model_dir, config, available = await self._read(model, sources, override)
                model_dir = await self._run_load_agents(model, model_dir, config)
                # auto-complete may block: keep it off the event loop
                config, backend, versions = await asyncio.to_thread(self.preparer.prepare, name, model_dir, config,
                                                                    available)
                if config.HasField("ensemble_scheduling"):
                    await self._load_composing(model, config)
            except ServerError as error:
                model.error = error.message
                if model.agents is not None:
                    await model.agents.load_fail()
                await self._reject(previous, model, overridden=override is not None)
                return model
            latency = model_latency_settings(self.options.latency, config.model_metrics)
            for number in versions:
                spec = ModelSpec(name, number, config, model_dir, model_dir / str(number),
                                 backend.default_model_filename if backend is not None else "", self.client)
                model.versions[number] = ModelVersion(spec, stats=ModelStats(latency))
            keep_previous = previous is not None and previous.is_serving()
            if not keep_previous:
                self._put(model)  # the index shows it LOADING
            await asyncio.gather(*(self._load_version(backend, v) for v in model.versions.values()))
            if model.agents is not None:
                await (model.agents.load_fail() if model.failure() else model.agents.load_complete())
            if keep_previous and model.failure():
                await self._reject(previous, model)
                return model
            self._put(model)
            if previous is not None:
                await self._retire(previous)
            return model

    async def _read(self, model: Model, sources: list[RepositorySource],
                    override: LoadOverride | None) -> tuple[Path, ModelConfig, list[int]]:
        """The model's local directory, its config (not yet completed) and the versions available."""
        if override is not None and override.files:
            try:
                model.private_dir = await asyncio.to_thread(override.write_model_dir)
            except OSError as error:
                raise ServerError(f"failed to load '{model.name}': cannot write the override files: {error}") from None
            return model.private_dir, copy_config(override.config), override.versions()
        if len(sources) > 1:
            raise ServerError(f"failed to load '{model.name}': it appears in more than one model repository ("
                              + ", ".join(s.location for s in sources) + ")")
        return await self.preparer.fetch(sources[0], model.name, override.config if override is not None else None)

    async def _run_load_agents(self, model: Model, model_dir: Path, config: ModelConfig) -> Path:
        """LOAD the agents the config names (Triton's repo-agent API), in order; where the model's files are
        after them. An agent's refusal fails the load as a config that cannot be read does."""
        agents, failed = self.plugins.repository_agents, POLL_FAILED.format(name=model.name)
        try:
            model.agents = agent_chain(model.name, config, agents.get, model_dir, agents.names())
        except ServerError as error:
            raise ServerError(f"{failed}: {error.message}", error.status) from None
        if model.agents is None:
            return model_dir
        return await model.agents.load(model.name, model_dir, failed)

    async def _reject(self, previous: Model | None, model: Model, *, overridden: bool = False) -> None:
        """Settle a load that failed: ``previous`` keeps serving if it can, its record saying why. A load
        whose override (``overridden``) failed Triton's poll (its config or files could not be taken) leaves
        everything as it was, as Triton's never reaches its model life cycle: no record, so server readiness
        does not change. Otherwise the failed record takes the place of ``previous``."""
        failure, polled = model.failure(), POLL_FAILED.format(name=model.name) + ": "
        if failure.startswith(polled):  # Triton's log line for a model whose config it could not take
            log.error("Poll failed for model directory '%s': %s", model.name, failure.removeprefix(polled))
        else:
            log.error("%s", failure)  # Triton's text, which names the model
        if previous is not None and previous.is_serving():
            previous.reload_error = model.failure()
            previous.fingerprint = model.fingerprint  # poll mode retries once the files change again
            await self._retire(model)
            return
        if overridden and failure.startswith(polled):
            await self._retire(model)
            return
        self._put(model)
        if previous is not None:
            await self._retire(previous)
        if model.private_dir is not None and not model.versions:
            await self._retire(model)

    async def _retire(self, model: Model) -> None:
        """Unload the record's versions (in-flight requests finish first) and delete its private directory."""
        await self._unload_versions(model)
        if model.agents is not None:
            await model.agents.unload()
        if model.private_dir is not None:
            await asyncio.to_thread(remove_model_dir, model.private_dir)
            model.private_dir = None

    async def _load_composing(self, ensemble: Model, config: ModelConfig) -> None:
        """Load the models an ensemble's steps use that are not loaded yet (as Triton does), and
        record them as its dependencies; raise with Triton's words when one is missing or fails.
        Under --model-namespacing a step's model is the one of the ensemble's repository, else the only
        one of its name; the step's ``model_namespace`` then says which."""
        name, steps = ensemble.key, config.ensemble_scheduling.step
        for step in steps:
            check_model_name(step.model_name)
        if self.namespacing:
            where = await self._step_models(ensemble, sorted({step.model_name for step in steps}))
            for step in steps:
                step.model_namespace = where[step.model_name].location
            keys = {step.model_name: self._key(where[step.model_name], step.model_name) for step in steps}
        else:
            keys = {step.model_name: step.model_name for step in steps}
        used = sorted(set(keys.values()))
        circular = [model for model in used if model == name or model in self.dependents(name)
                    or name in self._awaited_through(model)]
        if circular:
            raise ServerError(f"ensemble '{name}' depends on '{circular[0]}', which depends on '{name}': "
                              "circular dependency")
        unloaded = [model for model in used if not (model in self.models and self.models[model].is_serving())]
        self._awaiting[name] = frozenset(unloaded)  # before any await: the next ensemble's check sees it
        try:
            if self.namespacing:
                names = {key: step_name for step_name, key in keys.items()}
                loaded = await asyncio.gather(*(self._load(key, names[key], [where[names[key]]], None, "", False)
                                                for key in unloaded))
            else:
                held = await asyncio.gather(*(self._holding(model, self.sources) for model in unloaded))
                missing = [model for model, sources in zip(unloaded, held) if not sources]
                if missing:
                    raise ServerError(f"ensemble {name} contains models that are not available or ambiguous: "
                                      + ", ".join(missing))
                loaded = await asyncio.gather(*(self.load(model, explicit=False) for model in unloaded))
        finally:
            del self._awaiting[name]
        for model, record in zip(unloaded, loaded):
            if not record.is_serving():
                raise ServerError(f"ensemble '{name}' depends on '{record.name}' which has no loaded version. "
                                  f"Model '{record.name}' loading failed with error: {record.failure()}")
        for step in steps:
            record = self.models[keys[step.model_name]]
            version = record.versions.get(step.model_version)
            if step.model_version != -1 and (version is None or version.state is not VersionState.READY):
                raise ServerError(f"ensemble '{name}' depends on '{step.model_name}' whose required version "
                                  f"{step.model_version} is not loaded.")
        self.declare_dependencies(name, used)

    async def _step_models(self, ensemble: Model, names: list[str]) -> dict[str, RepositorySource]:
        """--model-namespacing: the repository whose model each step name means, as Triton picks it: the
        ensemble's own repository when it holds one, else the only repository that does."""
        where: dict[str, RepositorySource] = {}
        missing = []
        for step_name in names:
            if ensemble.source is not None and await ensemble.source.exists(step_name):
                where[step_name] = ensemble.source
                continue
            held = await self._holding(step_name, self.sources)
            if len(held) == 1:
                where[step_name] = held[0]
            else:
                missing.append(step_name)
        if missing:
            raise ServerError(f"ensemble {ensemble.key} contains models that are not available or ambiguous: "
                              + ", ".join(missing))
        return where

    def _awaited_through(self, model: str) -> set[str]:
        """The models whose loads ``model``'s load waits for, directly or through other ensembles
        (an ensemble among them that waits for ``model`` would never load: a cycle)."""
        found: set[str] = set()
        pending = [model]
        while pending:
            for awaited in self._awaiting.get(pending.pop(), ()):
                if awaited not in found:
                    found.add(awaited)
                    pending.append(awaited)
        return found

    async def _load_version(self, backend: Backend | None, version: ModelVersion) -> None:
        spec = version.spec
        started = time.monotonic()
        try:
            version.labels = _read_labels(spec)
            specs = instance_specs(spec.name, spec.config)
            if backend is not None:  # an ensemble has no backend, Model or instances
                await _load_model(backend, version, specs)
            samples = warmup_samples(spec)
            if samples:
                await asyncio.gather(*(warm_up(spec, instance, samples) for instance in version.instances))
            kind = spec.config.WhichOneof("scheduling_choice") or "default"
            factory = self.plugins.schedulers.get(kind)
            assert factory is not None
            pool = InstancePool(spec, version.instances, stats=version.stats, limiter=self.options.rate_limiter)
            version.scheduler = factory(ModelContext(spec, pool, version.stats, self.client))
            await version.scheduler.start()
        except Exception as error:
            message = error.message if isinstance(error, ServerError) else f"{type(error).__name__}: {error}"
            version.state, version.reason = VersionState.UNAVAILABLE, message
            log.error("failed to load '%s' version %d: %s", spec.name, spec.version, message,
                      exc_info=None if isinstance(error, ServerError) else error)  # a bug: where it is
            await _unload_model(version)
            version.instances.clear()
            return
        version.stats.load_seconds = time.monotonic() - started
        version.state, version.reason = VersionState.READY, ""
        log.info("loaded '%s' version %d (%d instance(s))", spec.name, spec.version, len(version.instances))

    async def unload(self, name: str, *, unload_dependents: bool = False, repository: str = "") -> None:
        """Unload every version of ``name`` and of the models that use it (``declare_dependencies``: an
        ensemble cannot run without its steps); in-flight requests finish first. With
        ``unload_dependents``, also unload the models ``name`` uses that no load asked for (an
        ensemble's composing models) and nothing loaded still uses. That is what Triton 2.51 does. A
        non-empty ``repository`` must name the repository the model was loaded from."""
        check_model_name(name)
        sources = self.sources_named(repository)
        targets: list[tuple[str, list[RepositorySource] | None]] = [(name, sources)]
        if self.namespacing:  # the model of that name in each of ``sources``, loaded or not
            keys = self._keys.get(name, set())
            held = await self._locate(name, sources) if not keys else sources
            targets = [(self._key(source, name), [source]) for source in held
                       if self._key(source, name) in self.models or not keys]
            if name in keys and not repository:  # loaded from override files, which no repository holds
                targets.append((name, None))
            if not targets:
                raise not_found(f"model '{name}' was not loaded from model repository '{repository}'")
        for key, where in targets:
            await asyncio.gather(*(self._unload_model(dependent) for dependent in self.dependents(key)))
            self._explicit.discard(key)
            await self._unload_model(key, where, repository, name)
            if unload_dependents:
                await self._unload_unused(key)

    async def _unload_unused(self, name: str) -> None:
        """Unload, recursively, the models ``name`` uses that were loaded only for the models using them
        and that no serving model uses any more."""
        for used in sorted(self._dependencies.get(name, ())):
            users = [m for m, uses in self._dependencies.items() if used in uses and m in self.models]
            if used in self._explicit or any(self.models[m].is_serving() for m in users):
                continue
            await self._unload_model(used)
            await self._unload_unused(used)

    async def _unload_model(self, key: str, sources: list[RepositorySource] | None = None,
                            repository: str = "", name: str = "") -> None:
        """Unload record ``key`` (of model ``name``, by default the key); a model never loaded must be in
        ``sources`` (None: it is a no-op)."""
        name = name or key
        async with self._lock(key):
            model = self.models.get(key)
            if model is None:
                if sources is None:
                    return
                await self._locate(name, sources)  # an unknown model is an error; a known, unloaded one is a no-op
                model = Model(name, key)
                self._put(model)
            elif repository and sources is not None and model.source not in sources:
                raise not_found(f"model '{name}' was not loaded from model repository '{repository}'")
            model.wanted = False
            model.reload_error = ""
            await self._retire(model)

    async def remove(self, key: str) -> None:
        """Unload record ``key`` and forget it (poll mode: its directory left the repository)."""
        async with self._lock(key):
            model = self._pop(key)
            if model is not None:
                await self._retire(model)

    async def _unload_versions(self, model: Model) -> None:
        await asyncio.gather(*(self._unload_version(v) for v in model.versions.values()))

    async def _unload_version(self, version: ModelVersion) -> None:
        if version.state is not VersionState.READY:
            if version.state is VersionState.UNAVAILABLE and not version.reason:
                version.reason = "unloaded"
            return
        version.state = VersionState.UNLOADING
        if version.scheduler is not None:
            try:
                await asyncio.wait_for(version.scheduler.stop(), self.options.drain_timeout_s)
            except asyncio.TimeoutError:
                log.warning("'%s' version %d: in-flight requests still running after %.0f s; unloading anyway",
                            version.spec.name, version.version, self.options.drain_timeout_s)
        await _unload_model(version)
        version.state, version.reason = VersionState.UNAVAILABLE, "unloaded"
        log.info("unloaded '%s' version %d", version.spec.name, version.version)

    async def shutdown(self) -> None:
        await asyncio.gather(*(self._unload_model(name) for name in list(self.models)))


def check_model_name(name: str) -> None:
    """Refuse a model name that is not exactly one folder name inside a repository: empty, ``.`` or
    ``..``, or holding ``/``, ``\\`` or NUL would name a folder elsewhere (``../x`` escapes the
    repository). ``load`` and ``unload`` (every route of both protocols, ``--load-model``) and an
    ensemble's steps check their names here before any source is asked for them."""
    if name in ("", ".", "..") or any(char in name for char in "/\\\0"):
        raise ServerError(f"invalid model name '{name}': a model name must be one folder name of the model "
                          "repository (not empty, '.' or '..', and without '/', '\\' or NUL characters)")


def _unchanged(model: Model, fingerprint: str) -> bool:
    """Whether loading ``model`` again, from files with ``fingerprint``, would change nothing."""
    return (model.wanted and model.is_ready() and not model.reload_error and model.private_dir is None
            and bool(fingerprint) and fingerprint == model.fingerprint)


def _kept(model: Model) -> str:
    """The index's reason for a version that kept serving through a failed reload ("" if none failed)."""
    return f"the last reload failed, so this version keeps serving: {model.reload_error}" if model.reload_error else ""


def instance_specs(name: str, config: ModelConfig) -> list[InstanceSpec]:
    """One InstanceSpec per instance: ``count`` per group, times each GPU for KIND_GPU groups
    (the listed ``gpus``, else every visible GPU). Raises if a KIND_GPU group has no GPU to use."""
    specs = []
    for group in config.instance_group:
        kind = ModelInstanceGroup.Kind.Name(group.kind).removeprefix("KIND_")
        devices = [0]
        if group.kind == ModelInstanceGroup.KIND_GPU:
            visible = visible_gpu_ids()
            devices = list(group.gpus) or visible
            missing = [gpu for gpu in devices if gpu not in visible]
            where = f"instance group {group.name} of model {name}"
            if not devices:  # Triton's words, then why
                raise ServerError(f"{where} has kind KIND_GPU but no GPUs are available (no GPU is visible on "
                                  "this machine)")
            if missing:
                raise ServerError(f"{where} specifies invalid or unsupported gpu id {missing[0]}. GPUs with at least "
                                  "the minimum required CUDA compute compatibility of 6.000000 are: "
                                  + ", ".join(map(str, visible))
                                  + ("" if visible else " (no GPU is visible on this machine)"))
        index = 0
        for device in devices:
            for _ in range(group.count):
                specs.append(InstanceSpec(f"{group.name}_{index}", group, index, kind, device))
                index += 1
    return specs


def _read_labels(spec: ModelSpec) -> dict[str, list[str]]:
    labels = {}
    for output in spec.config.output:
        if output.label_filename:
            text = (spec.model_dir / output.label_filename).read_text(encoding="utf-8")
            labels[output.name] = text.splitlines()
    return labels


async def _load_model(backend: Backend, version: ModelVersion, specs: list[InstanceSpec]) -> None:
    """Create and load the version's Model, then create its instances and load them concurrently.
    ``version.model`` and ``version.instances`` hold what loaded; on a failure (after every instance
    load finished) the first error is raised, for the caller to unload what loaded."""
    version.spec.parameters = model_parameters(backend, version.spec)
    model = backend.create_model(version.spec)
    await model.load()
    version.model = model
    created = [model.create_instance(spec) for spec in specs]
    results = await asyncio.gather(*(instance.load() for instance in created), return_exceptions=True)
    version.instances = [instance for instance, result in zip(created, results) if result is None]
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def _unload_model(version: ModelVersion) -> None:
    """Unload the version's loaded instances, then its Model; errors are logged (an unload goes on)."""
    results = await asyncio.gather(*(i.unload() for i in version.instances), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            log.error("error while unloading an instance of model '%s': %s", version.spec.name, result)
    model, version.model = version.model, None
    if model is not None:
        try:
            await model.unload()
        except Exception as error:
            log.error("error while unloading model '%s' version %d: %s", version.spec.name, version.version, error)
