"""The FIL config parameters (Triton's names, string values), parsed and checked."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from triton_serve.plugin import ModelConfig, ServerError

# model_type -> the file Triton's FIL backend reads from the version folder by default
MODEL_FILES: dict[str, str] = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}
DEFAULT_MODEL_TYPE = "xgboost"  # Triton's default when the parameter is absent
XGBOOST_TYPES = ("xgboost", "xgboost_json", "xgboost_ubj")


@dataclass(frozen=True)
class FilOptions:
    """What a model's ``parameters`` ask of the FIL backend. Other keys (Triton FIL's tuning knobs
    such as ``algo`` or ``threads_per_tree``) do not change predictions and are ignored.

    ``is_classifier`` is None when neither ``output_class`` nor ``is_classifier`` is set: the
    model's own task (classifier or not) decides.
    """

    model_type: str = DEFAULT_MODEL_TYPE
    is_classifier: bool | None = None
    predict_proba: bool = False
    threshold: float = 0.5
    cpu_nthread: int = -1
    xgboost_allow_unknown_field: bool = False

    @classmethod
    def from_config(cls, config: ModelConfig) -> FilOptions:
        """Read the parameters; raise a ServerError naming any parameter whose value is invalid."""
        values = {key: value.string_value.strip() for key, value in config.parameters.items()}
        model_type = values.get("model_type", DEFAULT_MODEL_TYPE)
        if model_type not in MODEL_FILES:
            raise ServerError(f"parameter 'model_type' is '{model_type}'; expected one of "
                              + ", ".join(MODEL_FILES))
        output_class = _bool(values, "output_class")
        is_classifier = _bool(values, "is_classifier")
        if output_class is not None and is_classifier is not None and output_class != is_classifier:
            raise ServerError(f"parameters 'output_class' ({values['output_class']}) and 'is_classifier' "
                              f"({values['is_classifier']}) disagree; set only one")
        return cls(
            model_type=model_type,
            is_classifier=output_class if output_class is not None else is_classifier,
            predict_proba=bool(_bool(values, "predict_proba")),
            threshold=_float(values, "threshold", 0.5),
            cpu_nthread=_int(values, "cpu_nthread", -1),
            xgboost_allow_unknown_field=bool(_bool(values, "xgboost_allow_unknown_field")),
        )

    def model_path(self, version_dir: Path, config: ModelConfig) -> Path:
        """The model file: ``default_model_filename`` from the config, else model_type's default."""
        return version_dir / (config.default_model_filename or MODEL_FILES[self.model_type])


def _bool(values: dict[str, str], key: str) -> bool | None:
    if key not in values:
        return None
    text = values[key].lower()
    if text not in ("true", "false"):
        raise ServerError(f"parameter '{key}' is '{values[key]}'; expected 'true' or 'false'")
    return text == "true"


def _float(values: dict[str, str], key: str, default: float) -> float:
    if key not in values:
        return default
    try:
        return float(values[key])
    except ValueError:
        raise ServerError(f"parameter '{key}' is '{values[key]}'; expected a number") from None


def _int(values: dict[str, str], key: str, default: int) -> int:
    if key not in values:
        return default
    try:
        return int(values[key])
    except ValueError:
        raise ServerError(f"parameter '{key}' is '{values[key]}'; expected an integer") from None
