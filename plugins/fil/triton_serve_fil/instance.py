"""A FIL model version and its instances: Treelite's GTIL on the CPU, or XGBoost on a GPU (KIND_GPU)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from triton_serve.plugin import (FrameworkInstance, InferenceRequest, InferenceResponse, InstanceSpec, Model,
                                 ModelInstance, ServerError, Status)

from .backend import output_rule, read_forest
from .model_config import INPUT_NAME, OUTPUT_NAME, check_config
from .options import XGBOOST_TYPES, FilParameters
from .outputs import OutputRule


class FilModel(Model):
    """One version of a tree model; each instance reads the model file for its own device."""

    def create_instance(self, instance: InstanceSpec) -> ModelInstance:
        return FilInstance(self, instance)


class FilInstance(FrameworkInstance):
    """One copy of a tree model. A request whose rows have the wrong width fails alone; the others run."""

    num_feature: int
    _scores: Callable[[np.ndarray], np.ndarray]
    _rule: OutputRule
    _width: int
    _squeezed: tuple[int, ...]

    def open(self) -> None:
        spec = self.model.spec
        try:
            self._open()
        except ServerError as error:
            raise ServerError(f"failed to load FIL model '{spec.name}' version {spec.version}: {error.message}",
                              error.status) from None

    def _open(self) -> None:
        spec = self.model.spec
        options: FilParameters = spec.parameters
        config = spec.config
        forest = read_forest(options, spec, config)
        self._rule = output_rule(options, forest)
        self._width = check_config(config, forest, self._rule)
        # As Triton's FIL backend: unit dims of output__0 are squeezed away ([batch] for dims [1]).
        self._squeezed = () if list(config.output[0].dims) == [1] else (self._width,)
        self.num_feature = forest.num_feature
        if self.spec.kind == "GPU":
            if options.model_type not in XGBOOST_TYPES:
                raise ServerError(f"KIND_GPU runs only XGBoost models (model_type {', '.join(XGBOOST_TYPES)}); "
                                  f"model_type '{options.model_type}' needs KIND_CPU", Status.UNSUPPORTED)
            from .gpu import XGBoostGpuScorer
            path = options.model_path(spec.version_dir, config)
            self._scores = XGBoostGpuScorer(path, self.spec.device_id, forest.num_scores).scores
        else:
            nthread = options.cpu_nthread
            self._scores = lambda rows: forest.scores(rows, nthread)

    async def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse]:
        errors = [self._feature_error(request) for request in requests]
        valid = [request for request, error in zip(requests, errors) if error is None]
        answers = iter(await super().execute(valid) if valid else [])
        return [InferenceResponse.from_error(error) if error else next(answers) for error in errors]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = np.ascontiguousarray(inputs[INPUT_NAME], dtype=np.float32)
        output = self._rule.apply(self._scores(rows), self._width)
        return {OUTPUT_NAME: output.reshape(len(output), *self._squeezed)}

    def close(self) -> None:
        del self._scores

    def _feature_error(self, request: InferenceRequest) -> ServerError | None:
        """Rows of the wrong width (possible when input dims are [-1]) fail only their own request."""
        shape = request.inputs[INPUT_NAME].shape
        if len(shape) == 2 and shape[1] == self.num_feature:
            return None
        return ServerError(f"model '{self.model.spec.name}' reads {self.num_feature} features per row, but input "
                           f"'{INPUT_NAME}' has shape {list(shape)}; expected [-1, {self.num_feature}]")
