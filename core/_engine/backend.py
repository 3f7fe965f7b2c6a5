"""The backend API: what a framework plugin subclasses to load and run models."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .client import InferenceClient
from .options import NoOptions

if TYPE_CHECKING:
    from .inference import InferenceRequest, InferenceResponse
    from .protos.model_config_pb2 import ModelConfig, ModelInstanceGroup


@dataclass
class ModelSpec:
    """One version of one model, as a backend sees it.

    ``config`` is the model's ModelConfig message (auto-complete may change it in place);
    ``model_dir`` is ``<repository>/<model>``; ``version_dir`` is ``<model_dir>/<version>``;
    ``client`` sends requests to other models of this server (a Python model's BLS calls);
    ``parameters`` is the config's ``parameters`` parsed into the backend's ``Parameters`` dataclass (the
    core fills it before auto-complete and before the version loads).
    """

    name: str
    version: int
    config: ModelConfig
    model_dir: Path
    version_dir: Path
    default_model_filename: str = ""
    client: InferenceClient = field(default_factory=InferenceClient)
    parameters: Any = None

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
    """One loaded copy of a model that executes batches of requests, made by ``Model.create_instance``.

    ``model`` is the Model it belongs to (``model.spec.config``...), ``spec`` this instance's entry of the
    instance group. Every method runs on the server's event loop, so none may block it: a framework that
    computes in-process subclasses ``FrameworkInstance``, which runs it on the instance's own thread.
    The scheduler calls ``execute`` on one instance for at most ``max_batches_in_flight`` batches at once.
    """

    def __init__(self, model: Model, spec: InstanceSpec) -> None:
        self.model = model
        self.spec = spec

    # True when requests still open after ``execute`` returned None are answered later through
    # ``request.send`` (a Python model's response senders); such an instance must then end each one
    # itself, also when it fails or unloads. False: the scheduler fails them at once.
    answers_later: bool = False

    # How many batches the scheduler may hand this instance at once. 1: ``execute`` never runs concurrently.
    # An instance that sends batches to a process of its own, which runs them in order, may take more: the
    # next batch is then already there when one ends (a Python model's instance takes 8). The dynamic batcher
    # still hands each instance one batch at a time, as Triton's does; the sequence batcher always does.
    max_batches_in_flight: int = 1

    async def load(self) -> None:
        """Event loop, once, after ``Model.load`` and before the instance serves (the instances of a
        model load concurrently). Raise to fail the model's load, after releasing what this load took:
        ``unload`` is called only on instances whose load returned."""

    @abstractmethod
    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse] | None:
        """Event loop: run a batch. Return one response per request, in order, or ``None`` after answering
        each request yourself through ``request.send`` (decoupled models stream 0..N responses).
        Raising fails every request of the batch with the error."""

    async def unload(self) -> None:
        """Event loop, once, when the model version unloads (or a sibling's load failed), before
        ``Model.unload``; release every resource here."""

    def is_ready(self) -> bool:
        """Event loop: whether this instance can serve now. A loaded model version serves while any
        of its instances is ready."""
        return True

    def not_ready_reason(self) -> str:
        """Event loop: why ``is_ready()`` is False (shown in the repository index and in request errors)."""
        return "instance is not ready"

    async def check_ready(self) -> bool:
        """Event loop: the model-ready check of ``/v2/models/{model}/ready`` (gRPC ``ModelReady``), and strict
        server readiness, ask every instance of a ready version for which ``is_ready()`` holds; the version reads
        ready only if all answer True (Triton's ``TRITONBACKEND_ModelInstanceReady``). Ask the framework here (a
        Python model's ``is_ready()``); answer promptly: the client waits."""
        return True


class Model(ABC):
    """One loaded version of one model, made by ``Backend.create_model``: what its instances share.

    ``spec`` is the version's ModelSpec (its config is final here), ``backend`` the Backend that made it.
    Parse what the instances need from the config once, in ``__init__`` or ``load``, and keep here what
    they share (a session pool, engines per GPU, counters). The core calls ``load``, then
    ``create_instance`` for each instance and loads them, and, once every loaded instance unloaded,
    ``unload``. Every method runs on the server's event loop.
    """

    def __init__(self, backend: Backend, spec: ModelSpec) -> None:
        self.backend = backend
        self.spec = spec

    async def load(self) -> None:
        """Event loop, once, before any instance is created. Raise to fail the load, after releasing
        what this load took: ``unload`` is called only when ``load`` returned."""

    @abstractmethod
    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        """Event loop: create (but do not load) one instance; raise ``ServerError`` to refuse it (e.g. a
        kind this backend cannot run)."""

    async def unload(self) -> None:
        """Event loop, once, after every loaded instance unloaded, when the version unloads or its load
        failed; release what the instances shared."""


class Backend(ABC):
    """A framework backend: registered under ``name`` and Triton ``platforms``; makes a Model for each
    model version that loads, which makes its instances (backend -> model -> instance, as in Triton).

    The server creates one object per backend name. ``Options`` declares what ``--backend-config`` sets
    (``--backend-config=<name>,<key>=<value>`` and Triton's global ``<key>=<value>``) and ``Parameters``
    what a model's config ``parameters`` set, each a frozen dataclass of ``option()`` fields; the core
    parses both: ``self.options`` is an ``Options`` and ``ModelSpec.parameters`` a ``Parameters``.
    """

    name: ClassVar[str]
    platforms: ClassVar[tuple[str, ...]] = ()
    default_model_filename: ClassVar[str] = ""
    # Other file names that identify this backend's models when a config names no backend.
    other_model_filenames: ClassVar[tuple[str, ...]] = ()
    # Instance kinds this backend runs: KIND_AUTO means GPU when "GPU" is listed and a GPU is
    # visible, else CPU (as in Triton).
    instance_kinds: ClassVar[tuple[str, ...]] = ("CPU",)
    Options: ClassVar[type[Any]] = NoOptions
    Parameters: ClassVar[type[Any]] = NoOptions

    def __init__(self, options: Any = None) -> None:
        if options is not None and not isinstance(options, self.Options):
            raise TypeError(f"backend '{self.name}' takes its options as a {self.Options.__qualname__}, "
                            f"not {type(options).__name__}")
        self.options: Any = self.Options() if options is None else options

    def auto_complete_config(self, model: ModelSpec) -> None:
        """A worker thread (it may block on reading the model file), once per load, before the config is
        defaulted and validated: fill in what the config leaves out (inputs, outputs, max_batch_size)
        from the model file, editing ``model.config`` in place. Not called with
        ``--disable-auto-complete-config``. Loads of different models call it concurrently."""

    @abstractmethod
    def create_model(self, spec: ModelSpec) -> Model:
        """Event loop: create (but do not load) the Model of one version whose config is final."""

    def unavailable_reason(self) -> str | None:
        """Any thread (a load's worker thread, ``triton-serve plugins``): why this backend cannot serve on
        this machine (e.g. its framework is missing), or None."""
        return None
