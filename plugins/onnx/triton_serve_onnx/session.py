"""Opening ONNX Runtime sessions: the model file, the options and providers from the config, clear errors."""
from __future__ import annotations

import contextlib
import functools
import io
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from triton_serve.plugin import InstanceSpec, ModelSpec, ServerError, Status

from .parameters import OnnxRuntimeParameters, run_options, session_options
from .providers import CPU, CUDA, TENSORRT, Provider, check_enabled, choose_providers
from .runner import SessionRunner
from .signature import read_signature
from .validation import check_config_matches_model

log = logging.getLogger(__name__)


def open_instance_session(model: ModelSpec, instance: InstanceSpec) -> SessionRunner:
    """The session one instance runs, checked against the config. Blocks: call it off the event loop."""
    import onnxruntime

    parameters: OnnxRuntimeParameters = model.parameters
    providers = choose_providers(model.config, parameters, instance, model.name,
                                 onnxruntime.get_available_providers())
    if any(name in (CUDA, TENSORRT) for name, _ in providers):
        load_gpu_libraries()
    options = session_options(parameters, model.config, model.name)
    per_run = run_options(parameters, model.name, instance)
    session = create_session(model_path(model), options, providers, model.name)
    check_enabled(session, providers, instance, model.name)
    signature = read_signature(session)
    check_config_matches_model(model.config, signature, model.name)
    return SessionRunner(session, signature, model.config, model.name, per_run)


@functools.cache
def load_gpu_libraries() -> None:
    """Load, once per process, the CUDA and cuDNN libraries onnxruntime-gpu's providers need from the
    ``nvidia-*`` wheels installed beside it (``onnxruntime-gpu[cuda,cudnn]``): ONNX Runtime does not look there
    by itself unless torch loaded them first. Where they are not found, the system's are used; a provider that
    still cannot start is reported by ``check_enabled``."""
    import onnxruntime

    preload = getattr(onnxruntime, "preload_dlls", None)  # ONNX Runtime 1.21 and later
    if preload is None:
        return
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):  # it reports what it could not load by printing
            preload()
    except Exception as error:  # a layout it does not expect: the system's libraries may still do
        said.write(f"{type(error).__name__}: {error}")
    if said.getvalue().strip():
        log.info("onnxruntime.preload_dlls(): %s", " ".join(said.getvalue().split()))


def open_probe_session(model: ModelSpec) -> Any:
    """A CPU session without graph optimizations, only to read the model's inputs and outputs."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return create_session(model_path(model), options, [(CPU, {})], model.name)


def model_path(model: ModelSpec) -> Path:
    """The ONNX file: the version's model file, or ``model.onnx`` inside it when it is a directory."""
    path = model.model_file
    return path / "model.onnx" if path.is_dir() else path


def create_session(path: Path, options: Any, providers: Sequence[Provider], model_name: str) -> Any:
    import onnxruntime

    if not path.is_file():
        raise ServerError(f"model '{model_name}': model file '{path}' does not exist", Status.UNAVAILABLE)
    try:
        return onnxruntime.InferenceSession(str(path), sess_options=options,
                                            providers=[name for name, _ in providers],
                                            provider_options=[dict(opts) for _, opts in providers])
    except Exception as error:  # ONNX Runtime's errors share no base class beyond Exception
        raise ServerError(f"model '{model_name}': ONNX Runtime cannot load '{path}': {error}") from None
