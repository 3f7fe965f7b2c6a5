"""The ``fil`` backend: Triton FIL model repositories served with Treelite (CPU) or XGBoost (GPU)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from triton_serve.plugin import (Backend, InferenceRequest, InferenceResponse, InstanceSpec, ModelInstance, ModelSpec,
                                 ServerError, Status, concat_inputs, split_outputs)

from .model_config import INPUT_NAME, OUTPUT_NAME, check_config, complete_config
from .options import DEFAULT_MODEL_TYPE, MODEL_FILES, XGBOOST_TYPES, FilOptions
from .outputs import OutputRule

if TYPE_CHECKING:
    from triton_serve.plugin import ModelConfig

    from .forest import Forest

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's default-max-batch-size for auto-completed configs


class FilBackend(Backend):
    """Serves XGBoost (legacy binary, JSON, UBJSON), LightGBM text and Treelite checkpoint models.

    Backend option (``--backend-config=fil,default-max-batch-size=N``): the max_batch_size that
    auto-complete gives a config without one (default 4, as in Triton).
    """

    name = "fil"
    default_model_filename = MODEL_FILES[DEFAULT_MODEL_TYPE]
    instance_kinds = ("CPU", "GPU")

    def unavailable_reason(self) -> str | None:
        try:
            import treelite  # noqa: F401
        except ImportError as error:
            return f"Treelite cannot be imported ({error}): pip install treelite"
        return None

    def auto_complete_config(self, model: ModelSpec) -> None:
        config = model.config
        if config.input and config.output and config.max_batch_size > 0:
            return
        options = FilOptions.from_config(config)
        forest = read_forest(options, model, config)
        complete_config(config, forest, output_rule(options, forest), self._default_max_batch_size())

    def create_instance(self, model: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        return FilInstance(model, instance)

    def _default_max_batch_size(self) -> int:
        text = self.options.get("default-max-batch-size", str(DEFAULT_MAX_BATCH_SIZE))
        try:
            return int(text)
        except ValueError:
            raise ServerError(f"backend option 'default-max-batch-size' is '{text}'; expected an integer") from None


class FilInstance(ModelInstance):
    """One copy of a tree model: Treelite's GTIL on the CPU, or XGBoost on a GPU (KIND_GPU)."""

    def __init__(self, model: ModelSpec, instance: InstanceSpec) -> None:
        self.model = model
        self.instance = instance
        self.num_feature = 0
        self._scores: Callable[[np.ndarray], np.ndarray] | None = None
        self._rule: OutputRule | None = None
        self._width = 1
        self._squeezed: tuple[int, ...] = ()

    async def load(self) -> None:
        try:
            await asyncio.to_thread(self._load)
        except ServerError as error:
            raise ServerError(f"failed to load FIL model '{self.model.name}' version {self.model.version}: "
                              f"{error.message}", error.status) from None

    def _load(self) -> None:
        config = self.model.config
        options = FilOptions.from_config(config)
        forest = read_forest(options, self.model, config)
        self._rule = output_rule(options, forest)
        self._width = check_config(config, forest, self._rule)
        self._squeezed = () if list(config.output[0].dims) == [1] else (self._width,)
        self.num_feature = forest.num_feature
        if self.instance.kind == "GPU":
            if options.model_type not in XGBOOST_TYPES:
                raise ServerError(f"KIND_GPU runs only XGBoost models (model_type {', '.join(XGBOOST_TYPES)}); "
                                  f"model_type '{options.model_type}' needs KIND_CPU", Status.UNSUPPORTED)
            from .gpu import XGBoostGpuScorer
            path = options.model_path(self.model.version_dir, config)
            self._scores = XGBoostGpuScorer(path, self.instance.device_id, forest.num_scores).scores
        else:
            nthread = options.cpu_nthread
            self._scores = lambda rows: forest.scores(rows, nthread)

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse]:
        errors = [self._feature_error(request) for request in requests]
        valid = [request for request, error in zip(requests, errors) if error is None]
        answers = iter(await self._infer(valid) if valid else [])
        return [InferenceResponse.from_error(error) if error else next(answers) for error in errors]

    async def _infer(self, requests: list[InferenceRequest]) -> list[InferenceResponse]:
        rows = concat_inputs(requests, self.model.config)[INPUT_NAME]
        output = await asyncio.to_thread(self._predict, rows)
        # As Triton's FIL backend: unit dims of output__0 are squeezed away ([batch] for dims [1]).
        return split_outputs({OUTPUT_NAME: output.reshape(len(output), *self._squeezed)}, requests, self.model.config)

    def _predict(self, rows: np.ndarray) -> np.ndarray:
        if self._scores is None or self._rule is None:
            raise ServerError(f"FIL model '{self.model.name}' is not loaded", Status.UNAVAILABLE)
        return self._rule.apply(self._scores(np.ascontiguousarray(rows, dtype=np.float32)), self._width)

    def _feature_error(self, request: InferenceRequest) -> ServerError | None:
        """Rows of the wrong width (possible when input dims are [-1]) fail only their own request."""
        shape = request.inputs[INPUT_NAME].shape
        if len(shape) == 2 and shape[1] == self.num_feature:
            return None
        return ServerError(f"model '{self.model.name}' reads {self.num_feature} features per row, but input "
                           f"'{INPUT_NAME}' has shape {list(shape)}; expected [-1, {self.num_feature}]")

    async def unload(self) -> None:
        self._scores = None


def read_forest(options: FilOptions, model: ModelSpec, config: ModelConfig) -> Forest:
    """The model file of ``model`` read into Treelite (imported here, so a missing Treelite only
    makes the backend unavailable instead of breaking the plugin's import)."""
    from .forest import load_forest
    return load_forest(options.model_path(model.version_dir, config), options.model_type,
                       options.xgboost_allow_unknown_field)


def output_rule(options: FilOptions, forest: Forest) -> OutputRule:
    """The output semantics for a model; without output_class/is_classifier, the model's task decides."""
    is_classifier = forest.is_classifier_task if options.is_classifier is None else options.is_classifier
    return OutputRule(forest.num_scores, is_classifier, options.predict_proba, options.threshold)
