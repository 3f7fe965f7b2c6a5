"""The backend API: what a framework plugin subclasses to load and run models."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from .client import InferenceClient

if TYPE_CHECKING:
    from .inference import InferenceRequest, InferenceResponse
    from .protos.model_config_pb2 import ModelConfig, ModelInstanceGroup


@dataclass
class ModelSpec:
    """One version of one model, as a backend sees it.

    ``config`` is the model's ModelConfig message (auto-complete may change it in place);
    ``model_dir`` is ``<repository>/<model>``; ``version_dir`` is ``<model_dir>/<version>``;
    ``client`` sends requests to other models of this server (a Python model's BLS calls).
    """

    name: str
    version: int
    config: ModelConfig
    model_dir: Path
    version_dir: Path
    default_model_filename: str = ""
    client: InferenceClient = field(default_factory=InferenceClient)

    @property
    def model_file(self) -> Path:
        """The model file: ``default_model_filename`` from the config, else the backend's default."""
        return self.version_dir / (self.config.default_model_filename or self.default_model_filename)


@dataclass
class InstanceSpec:
    """One model instance from the config's ``instance_group``: ``<group name>_<index>``, its kind and device."""

    name: str
    group: ModelInstanceGroup
    index: int
    kind: str  # "CPU", "GPU" or "MODEL"
    device_id: int = 0
    metadata: dict[str, str] = field(default_factory=dict)


class ModelInstance(ABC):
    """One loaded copy of a model that executes batches of requests.

    Every method runs on the server's event loop. ``execute`` must not block the loop:
    hand CPU-bound framework calls to a thread (``asyncio.to_thread``) or a process.
    The scheduler never calls ``execute`` on one instance concurrently.
    """

    # True when requests still open after ``execute`` returned None are answered later through
    # ``request.send`` (a Python model's response senders); such an instance must then end each one
    # itself, also when it fails or unloads. False: the scheduler fails them at once.
    answers_later: bool = False

    async def load(self) -> None:
        """Called once before the instance serves; raise to fail the model's load."""

    @abstractmethod
    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse] | None:
        """Run a batch. Return one response per request, in order, or ``None`` after answering
        each request yourself through ``request.send`` (decoupled models stream 0..N responses).
        Raising fails every request of the batch with the error."""

    async def unload(self) -> None:
        """Called once when the model version unloads; release every resource here."""

    def is_ready(self) -> bool:
        """Whether this instance can serve now. A model version is ready only if all its instances are."""
        return True

    def not_ready_reason(self) -> str:
        """Why ``is_ready()`` is False (shown in the repository index and in request errors)."""
        return "instance is not ready"


class Backend(ABC):
    """A framework backend: registered under ``name`` and Triton ``platforms``; makes model instances.

    The server creates one object per backend name, with the ``--backend-config=<name>,k=v`` options.
    """

    name: ClassVar[str]
    platforms: ClassVar[tuple[str, ...]] = ()
    default_model_filename: ClassVar[str] = ""
    # Other file names that identify this backend's models when a config names no backend.
    other_model_filenames: ClassVar[tuple[str, ...]] = ()
    # Instance kinds this backend runs: KIND_AUTO means GPU when "GPU" is listed and a GPU is
    # visible, else CPU (as in Triton).
    instance_kinds: ClassVar[tuple[str, ...]] = ("CPU",)

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        self.options: dict[str, str] = dict(options or {})

    def auto_complete_config(self, model: ModelSpec) -> None:
        """Fill in what the config leaves out (inputs, outputs, max_batch_size) from the model file,
        editing ``model.config`` in place. Not called with ``--disable-auto-complete-config``."""

    @abstractmethod
    def create_instance(self, model: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        """Create (but do not load) one instance of ``model``."""

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot serve on this machine (e.g. its framework is missing), or None."""
        return None
