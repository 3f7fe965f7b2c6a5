"""The FIL config parameters (Triton's names), declared for the core's parser."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from triton_serve.plugin import ModelConfig, ServerError, option

ModelType = Literal["xgboost", "xgboost_json", "xgboost_ubj", "lightgbm", "treelite_checkpoint"]
# model_type -> the file Triton's FIL backend reads from the version folder by default
MODEL_FILES: dict[str, str] = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}
DEFAULT_MODEL_TYPE: ModelType = "xgboost"  # Triton's default when the parameter is absent
XGBOOST_TYPES = ("xgboost", "xgboost_json", "xgboost_ubj")


@dataclass(frozen=True)
class FilParameters:
    """What a model's ``parameters`` ask of the FIL backend, by Triton FIL's keys. Other keys (Triton FIL's
    tuning knobs such as ``algo`` or ``threads_per_tree``) do not change predictions and are ignored."""

    model_type: ModelType = option(DEFAULT_MODEL_TYPE, key="model_type", doc="the model file's format")
    output_class: bool | None = option(None, key="output_class", doc="Triton FIL's older name of is_classifier")
    classifier: bool | None = option(None, key="is_classifier",
                                     doc="a classifier (class indices or probabilities); unset: the model's own task")
    predict_proba: bool = option(False, key="predict_proba", doc="a classifier answers with probabilities")
    threshold: float = option(0.5, key="threshold", doc="the probability from which a binary classifier says 1")
    cpu_nthread: int = option(-1, key="cpu_nthread", doc="threads of the CPU predictor; -1: every core")
    xgboost_allow_unknown_field: bool = option(False, key="xgboost_allow_unknown_field",
                                               doc="read XGBoost JSON models with fields this XGBoost does not know")

    @property
    def is_classifier(self) -> bool | None:
        """``output_class`` or ``is_classifier`` (a ServerError when both are set and disagree), or None when
        neither is set: the model's own task (classifier or not) decides."""
        if None not in (self.output_class, self.classifier) and self.output_class != self.classifier:
            raise ServerError(f"parameters 'output_class' ({str(self.output_class).lower()}) and 'is_classifier' "
                              f"({str(self.classifier).lower()}) disagree; set only one")
        return self.classifier if self.output_class is None else self.output_class

    def model_path(self, version_dir: Path, config: ModelConfig) -> Path:
        """The model file: ``default_model_filename`` from the config, else model_type's default."""
        return version_dir / (config.default_model_filename or MODEL_FILES[self.model_type])
