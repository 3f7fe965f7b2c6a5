"""The ``transformers`` backend: a causal language model from a local Hugging Face directory per model version,
decoupled, under Triton's vLLM tensor contract (so the OpenAI front-end serves it unchanged)."""
from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Sequence as Batch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_serve.plugin import (Backend, DataType, InferenceRequest, InferenceResponse, InstanceSpec, Model,
                                 ModelInput, ModelInstance, ModelOutput, ModelSpec, ServerError, model_parameters,
                                 option)

from .engine import Engine
from .kv_cache import register_attention
from .metrics import LLMMetrics
from .sequence import Detokenizer, Sequence, Settings
from .tiny import ensure_tiny_llama

# Triton's vLLM backend contract: (name, type, optional) of each input, and each output.
CONTRACT_INPUTS = (("text_input", DataType.TYPE_STRING, False), ("stream", DataType.TYPE_BOOL, True),
                   ("sampling_parameters", DataType.TYPE_STRING, True),
                   ("exclude_input_in_output", DataType.TYPE_BOOL, True),
                   ("return_num_input_tokens", DataType.TYPE_BOOL, True),
                   ("return_num_output_tokens", DataType.TYPE_BOOL, True),
                   ("return_finish_reason", DataType.TYPE_BOOL, True),
                   ("return_cumulative_logprob", DataType.TYPE_BOOL, True),
                   ("return_logprobs", DataType.TYPE_BOOL, True))
CONTRACT_OUTPUTS = (("text_output", DataType.TYPE_STRING), ("num_input_tokens", DataType.TYPE_UINT32),
                    ("num_output_tokens", DataType.TYPE_UINT32), ("finish_reason", DataType.TYPE_STRING),
                    ("cumulative_logprob", DataType.TYPE_FP32), ("logprobs", DataType.TYPE_STRING))
SAMPLING_KEYS = {"max_tokens", "min_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty", "seed",
                 "stop", "ignore_eos", "logprobs"}
# vLLM's names for constrained decoding (the older and the newer): refused, this backend has none.
CONSTRAINED_DECODING_KEYS = ("structured_outputs", "guided_decoding")
MAX_LOGPROBS = 20  # the most top logprobs a token may ask for (vLLM's default max_logprobs)


@dataclass(frozen=True)
class Parameters:
    """A model's ``parameters`` for this backend."""

    model_path: str = option("", key="model_path", doc="the Hugging Face model directory, relative to the "
                                                        "model's directory; default: the version directory")
    tokenizer: str = option("", key="tokenizer", doc="the tokenizer directory (default: the model's); the OpenAI "
                                                     "front-end reads its chat template")
    max_num_seqs: int = option(8, key="max_num_seqs", minimum=1,
                               doc="sequences generated together (continuous batching); 1: one at a time")
    max_tokens_in_flight: int = option(0, key="max_tokens_in_flight", minimum=0,
                                       doc="bound on the prompt plus max_tokens of the running sequences together "
                                           "(the key-value budget); 0: none")
    device: str = option("", key="device", doc="torch device; default: cuda for a GPU instance, else cpu")
    create_tiny_model: bool = option(False, key="create_tiny_model",
                                     doc="make a tiny random-weight Llama chat model where the weights directory "
                                         "holds none (in the user's cache if it cannot be written): for examples")


class TransformersBackend(Backend):
    name = "transformers"
    instance_kinds = ("CPU", "GPU")
    Parameters = Parameters

    def auto_complete_config(self, model: ModelSpec) -> None:
        """Fill the vLLM contract's tensors and the decoupled policy; point ``tokenizer`` at the model directory."""
        config = model.config
        if not config.input:
            for name, data_type, optional in CONTRACT_INPUTS:
                config.input.append(ModelInput(name=name, data_type=data_type, dims=[1], optional=optional))
        if not config.output:
            for name, data_type in CONTRACT_OUTPUTS:
                config.output.append(ModelOutput(name=name, data_type=data_type, dims=[-1]))
        config.model_transaction_policy.decoupled = True
        if "tokenizer" not in config.parameters:
            parameters: Parameters = model_parameters(self, model)  # a bad value fails the load, naming it
            weights = _weights_dir(model, parameters.model_path, parameters.create_tiny_model)
            config.parameters["tokenizer"].string_value = str(weights.resolve())

    def create_model(self, spec: ModelSpec) -> Model:
        return TransformersModel(self, spec)

    def unavailable_reason(self) -> str | None:
        missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
        return f"{' and '.join(missing)} not installed" if missing else None


def _weights_dir(spec: ModelSpec, model_path: str, create_tiny_model: bool = False) -> Path:
    """Where the model's Hugging Face files are (made first, with ``create_tiny_model``, where there are none)."""
    weights = spec.model_dir / model_path if model_path else spec.version_dir
    if not create_tiny_model:
        return weights
    try:
        return ensure_tiny_llama(weights, spec.name)
    except (OSError, ImportError) as error:
        raise ServerError(f"transformers model '{spec.name}': cannot make its tiny model: {error}") from None


class TransformersModel(Model):
    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        if self.spec.config.max_batch_size > 0:
            raise ServerError(f"transformers model '{self.spec.name}': max_batch_size must be 0 (sequences are "
                              "batched by the engine: set the 'max_num_seqs' parameter)")
        return TransformersInstance(self, instance)


class TransformersInstance(ModelInstance):
    """One copy of the model with its generation engine; ``execute`` hands requests to the engine and returns."""

    answers_later = True
    model: TransformersModel

    async def load(self) -> None:
        spec = self.model.spec
        parameters: Parameters = spec.parameters
        device = parameters.device or (f"cuda:{self.spec.device_id}" if self.spec.kind == "GPU" else "cpu")
        loop = asyncio.get_running_loop()

        def build() -> Engine:
            weights = _weights_dir(spec, parameters.model_path, parameters.create_tiny_model)
            tokenizer_dir = Path(parameters.tokenizer) if parameters.tokenizer else weights
            from transformers import AutoModelForCausalLM, AutoTokenizer
            try:
                tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
                model: Any = AutoModelForCausalLM.from_pretrained(weights, local_files_only=True,
                                                                  attn_implementation=register_attention())
                model = model.to(device).eval()
            except (OSError, ValueError) as error:
                raise ServerError(f"transformers model '{spec.name}': cannot load '{weights}': {error}") from None
            context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
            try:
                return Engine(model, tokenizer, device, loop, context=context,
                              max_num_seqs=parameters.max_num_seqs,
                              max_tokens_in_flight=parameters.max_tokens_in_flight, name=spec.name,
                              metrics=LLMMetrics(spec.name, spec.version))
            except Exception as error:  # the model's attention does not go through transformers' interface
                raise ServerError(f"transformers model '{spec.name}': the engine cannot run '{weights}': "
                                  f"{type(error).__name__}: {error}") from None

        self.engine = await asyncio.to_thread(build)
        self.context = self.engine.runner.context

    async def execute(self, requests: Batch[InferenceRequest]) -> Batch[InferenceResponse] | None:
        for request in requests:
            try:
                self.engine.add(self._sequence(request))
            except ServerError as error:
                request.fail(error)
        return None

    def _sequence(self, request: InferenceRequest) -> Sequence:
        prompt = _text(request, "text_input")
        settings = _settings(request)
        ids = self.engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ServerError("The decoder prompt cannot be empty")  # vLLM's words
        if len(ids) >= self.context:
            raise ServerError(f"the prompt is {len(ids)} tokens long; model '{self.model.spec.name}' takes at most "
                              f"{self.context - 1} (its context is {self.context} tokens)")
        settings.max_tokens = min(settings.max_tokens, self.context - len(ids))
        generator = None
        if settings.seed is not None:
            import torch
            generator = torch.Generator(self.engine.device).manual_seed(settings.seed)
        return Sequence(request, prompt, ids, settings, Detokenizer(self.engine.tokenizer, ids), generator=generator)

    async def unload(self) -> None:
        await asyncio.to_thread(self.engine.stop)


def _text(request: InferenceRequest, name: str) -> str:
    tensor = request.inputs.get(name)
    if tensor is None or tensor.data.size == 0:
        raise ServerError(f"input '{name}' is missing")
    item = tensor.data.ravel()[0]
    return item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)


def _flag(request: InferenceRequest, name: str, default: bool) -> bool:
    tensor = request.inputs.get(name)
    return default if tensor is None or tensor.data.size == 0 else bool(tensor.data.ravel()[0])


def _settings(request: InferenceRequest) -> Settings:
    """The request's sampling parameters (vLLM's names; others are refused) and flags."""
    raw: dict[str, Any] = {}
    if "sampling_parameters" in request.inputs:
        try:
            raw = json.loads(_text(request, "sampling_parameters") or "{}")
        except ValueError as error:
            raise ServerError(f"'sampling_parameters' is not valid JSON: {error}") from None
        if not isinstance(raw, dict):
            raise ServerError("'sampling_parameters' must be a JSON object")
    for key in CONSTRAINED_DECODING_KEYS:
        if key in raw:
            raise ServerError(f"the transformers backend does not support constrained decoding: sampling "
                              f"parameter '{key}' is not accepted")
    unknown = sorted(set(raw) - SAMPLING_KEYS)
    if unknown:
        raise ServerError(f"unknown sampling parameters: {', '.join(unknown)}")
    stop = raw.get("stop") or []
    settings = Settings(stop=[stop] if isinstance(stop, str) else [str(item) for item in stop],
                        ignore_eos=bool(raw.get("ignore_eos", False)), stream=_flag(request, "stream", False),
                        exclude_input=_flag(request, "exclude_input_in_output", True),
                        return_input_tokens=_flag(request, "return_num_input_tokens", False),
                        return_output_tokens=_flag(request, "return_num_output_tokens", False),
                        return_finish_reason=_flag(request, "return_finish_reason", False),
                        return_logprobs=_flag(request, "return_logprobs", False),
                        return_cumulative_logprob=_flag(request, "return_cumulative_logprob", False))
    try:
        for key, kind in (("max_tokens", int), ("min_tokens", int), ("temperature", float), ("top_p", float),
                          ("presence_penalty", float), ("frequency_penalty", float)):
            if raw.get(key) is not None:
                setattr(settings, key, kind(raw[key]))
        if raw.get("seed") is not None:
            settings.seed = int(raw["seed"])
    except (TypeError, ValueError) as error:
        raise ServerError(f"a sampling parameter has a bad value: {error}") from None
    if raw.get("logprobs") is not None:
        top = raw["logprobs"]
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS:
            raise ServerError(f"sampling parameter 'logprobs' must be an integer from 0 to {MAX_LOGPROBS}, "
                              f"got {top!r}")
        settings.logprobs = top
    if settings.max_tokens < 1:
        raise ServerError(f"'max_tokens' must be at least 1, got {settings.max_tokens}")
    if settings.min_tokens < 0:  # vLLM's words, as the two below
        raise ServerError(f"min_tokens must be greater than or equal to 0, got {settings.min_tokens}.")
    if settings.min_tokens > settings.max_tokens:
        raise ServerError(f"min_tokens must be less than or equal to max_tokens={settings.max_tokens}, got "
                          f"{settings.min_tokens}.")
    return settings
