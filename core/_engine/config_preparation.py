"""Config preparation before a load: read the config, auto-complete, default and validate it, choose versions."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .backend import Backend, ModelSpec
from .client import InferenceClient
from .config import apply_defaults, read_config
from .config_validation import validate_config
from .devices import visible_gpu_ids
from .errors import ServerError, Status
from .options import model_parameters
from .pluginhost import PluginHost
from .protos.model_config_pb2 import ModelConfig, ModelInstanceGroup
from .registry import install_hint
from .scheduling import Scheduler
from .sources import RepositorySource

# Triton's answer to a load whose model or config it could not read.
POLL_FAILED = "failed to load '{name}', failed to poll from model repository"
ENSEMBLE_PLATFORM = "ensemble"

T = TypeVar("T")


class ConfigPreparer:
    """Turns a model directory's config into one ready to load, as Triton does before a load.

    ``auto_complete`` is False with ``--strict-model-config`` or ``--disable-auto-complete-config``;
    ``config_name`` is ``--model-config-name``.
    """

    def __init__(self, plugins: PluginHost, client: InferenceClient, *, auto_complete: bool,
                 config_name: str = "") -> None:
        self.plugins = plugins
        self.client = client
        self.auto_complete = auto_complete
        self.config_name = config_name

    async def fetch(self, source: RepositorySource, name: str,
                    config_override: ModelConfig | None = None) -> tuple[Path, ModelConfig, list[int]]:
        """The model's local directory holding the versions its policy selects, its config as written
        (or ``config_override``), and every version the source has."""
        try:
            model_dir = await source.model_dir(name, versions=())
            if config_override is not None:
                config = copy_config(config_override)
            else:
                config = await asyncio.to_thread(read_config, model_dir, name, self.config_name)
            available = await source.versions(name)
            model_dir = await source.model_dir(name, versions=select_versions(config, available))
        except OSError as error:
            raise ServerError(f"failed to load '{name}': {error}") from None
        return model_dir, config, available

    def prepare(self, name: str, model_dir: Path, config: ModelConfig,
                available: list[int]) -> tuple[ModelConfig, Backend | None, list[int]]:
        """Auto-complete, default and validate the config; choose the backend (None for an
        ensemble, which has no instances) and versions. Blocks (auto-complete reads model files):
        call it in a worker thread."""
        if config.platform == ENSEMBLE_PLATFORM and not config.backend:
            return self._prepare_ensemble(name, model_dir, config, available)
        backends = self.plugins.backends
        if not config.backend and not config.platform and self.auto_complete:
            config.backend = self._guess_backend(model_dir, probe_version(config, available))
        if not config.backend and not config.platform:
            raise ServerError(f"{POLL_FAILED.format(name=name)}: must specify 'platform' or 'backend' for '{name}' "
                              "(no installed backend recognizes a model file in the newest version)")
        backend_name = _wrap(name, lambda: backends.backend_name_for(config.backend, config.platform))
        if not config.backend and config.platform != "ensemble":
            config.backend = backend_name
        backend = _wrap(name, lambda: backends.instance(backend_name))
        reason = backend.unavailable_reason()
        if reason:
            raise ServerError(f"failed to load '{name}': backend '{backend_name}' is unavailable: {reason}",
                              Status.UNAVAILABLE)
        if not available:
            raise ServerError(f"failed to load '{name}': the model directory has no numeric version folder")
        if self.auto_complete:
            version = probe_version(config, available)
            assert version is not None  # available is not empty here
            spec = ModelSpec(name, version, config, model_dir, model_dir / str(version),
                             backend.default_model_filename, self.client)
            spec.parameters = _wrap(name, lambda: model_parameters(backend, spec))
            batching_before = config.max_batch_size
            _wrap(name, lambda: backend.auto_complete_config(spec))
            self._enable_dynamic_batching(config, batching_before)
        gpu_first = "GPU" in backend.instance_kinds and (visible_gpu_ids() or "CPU" not in backend.instance_kinds)
        return config, backend, self._check(name, model_dir, config, available,
                                            ModelInstanceGroup.KIND_GPU if gpu_first else ModelInstanceGroup.KIND_CPU)

    def _prepare_ensemble(self, name: str, model_dir: Path, config: ModelConfig,
                          available: list[int]) -> tuple[ModelConfig, None, list[int]]:
        """An ensemble: no backend, no auto-complete, no instances; its scheduler checks its steps."""
        if not available:
            raise ServerError(f"failed to load '{name}': the model directory has no numeric version folder")
        return config, None, self._check(name, model_dir, config, available, ModelInstanceGroup.KIND_CPU)

    def _check(self, name: str, model_dir: Path, config: ModelConfig, available: list[int],
               kind_auto: ModelInstanceGroup.Kind) -> list[int]:
        """Default and validate the config (the core's checks, then its scheduler's); the versions to load."""
        kind = config.WhichOneof("scheduling_choice") or "default"
        factory = self.plugins.schedulers.get(kind)
        try:
            apply_defaults(config, name, kind_auto)
            validate_config(config, model_dir)
            if factory is not None and isinstance(factory, type) and issubclass(factory, Scheduler):
                factory.check_config(config)
        except ServerError as error:  # Triton's message, after the words its load response gives
            raise ServerError(f"{POLL_FAILED.format(name=name)}: {error.message}", error.status) from None
        if factory is None:
            raise ServerError(f"failed to load '{name}': no installed plugin provides the '{kind}' scheduler; "
                              f"{install_hint(kind)}", Status.UNAVAILABLE)
        versions = select_versions(config, available)
        if not versions:
            raise ServerError(f"failed to load '{name}': no version folder matches its version_policy")
        return versions

    def _enable_dynamic_batching(self, config: ModelConfig, max_batch_size_before: int) -> None:
        """As Triton: when auto-complete turned batching on (max_batch_size > 1) for a config with no
        scheduling choice, use the dynamic batcher, if a plugin provides it."""
        if (max_batch_size_before == 0 and config.max_batch_size > 1 and not config.WhichOneof("scheduling_choice")
                and self.plugins.schedulers.get("dynamic_batching") is not None):
            config.dynamic_batching.SetInParent()

    def _guess_backend(self, model_dir: Path, version: int | None) -> str:
        """A backend whose default model file is in the version folder auto-complete reads, or ""."""
        folder = model_dir / str(version)
        if version is None or not folder.is_dir():
            return ""
        files = {p.name for p in folder.iterdir()}
        for backend_name in self.plugins.backends.names():
            backend = self.plugins.backends.get(backend_name)
            assert backend is not None
            if files.intersection((backend.default_model_filename, *backend.other_model_filenames)) - {""}:
                return backend_name
        return ""


def select_versions(config: ModelConfig, available: list[int]) -> list[int]:
    """The versions ``config.version_policy`` asks for, out of ``available`` (sorted ascending)."""
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return list(available)
    if choice == "specific":
        missing = sorted(set(policy.specific.versions) - set(available))
        if missing:
            raise ServerError(f"version_policy of model '{config.name}' asks for version(s) "
                              f"{', '.join(map(str, missing))}, which have no version folder")
        return sorted(set(policy.specific.versions))
    count = policy.latest.num_versions or 1
    return available[-count:]


def probe_version(config: ModelConfig, available: list[int]) -> int | None:
    """The version whose files auto-complete reads: the newest one the policy selects."""
    wanted = config.version_policy.specific.versions or available
    return wanted[-1] if wanted else None


def copy_config(config: ModelConfig) -> ModelConfig:
    """A copy of ``config`` that a load may complete without changing the original."""
    copied = ModelConfig()
    copied.CopyFrom(config)
    return copied


def _wrap(name: str, call: Callable[[], T]) -> T:
    """``call()``, its errors prefixed with Triton's "failed to load '<name>'"."""
    try:
        return call()
    except ServerError as error:
        raise ServerError(f"failed to load '{name}': {error.message}", error.status) from None
    except Exception as error:
        raise ServerError(f"failed to load '{name}': {type(error).__name__}: {error}") from None
