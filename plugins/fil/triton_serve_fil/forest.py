"""Tree models read into Treelite, whatever their format, and scored on the CPU with Treelite's GTIL."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import treelite

from triton_serve.plugin import ServerError

# Treelite's TaskType values (treelite/enum/task_type.h)
_CLASSIFIER_TASKS = (0, 2)  # kBinaryClf, kMultiClf
_SOURCE_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")


class Forest:
    """A tree ensemble loaded into Treelite: how many features it reads and scores it writes per row."""

    def __init__(self, model: treelite.Model) -> None:
        header = model.get_header_accessor()
        self.model = model
        self.num_feature = int(model.num_feature)
        num_target = int(header.get_field("num_target")[0])
        self.num_scores = num_target * int(np.max(header.get_field("num_class")))
        self.is_classifier_task = int(header.get_field("task_type")[0]) in _CLASSIFIER_TASKS

    def scores(self, rows: np.ndarray, nthread: int = -1) -> np.ndarray:
        """Transformed scores (probabilities for classifiers, values for regressors): (rows, num_scores) FP32."""
        result = treelite.gtil.predict(self.model, rows, nthread=nthread)
        return np.asarray(result, dtype=np.float32).reshape(rows.shape[0], self.num_scores)


def load_forest(path: Path, model_type: str, allow_unknown_field: bool = False) -> Forest:
    """Read ``path`` as ``model_type``; a missing or unreadable file raises a ServerError saying which."""
    if not path.is_file():
        raise ServerError(f"model file '{path.parent.name}/{path.name}' does not exist "
                          f"(model_type '{model_type}')")
    try:
        return Forest(_read(path, model_type, allow_unknown_field))
    except treelite.TreeliteError as error:
        hint = ""
        if model_type == "xgboost":
            hint = ("; model_type 'xgboost' is XGBoost's legacy binary format, and XGBoost 2.1 and later "
                    "save UBJSON even to a '.model' name: try model_type 'xgboost_ubj'")
        raise ServerError(f"cannot read '{path.parent.name}/{path.name}' as model_type '{model_type}': "
                          f"{_first_line(error)}{hint}") from None


def _read(path: Path, model_type: str, allow_unknown_field: bool) -> treelite.Model:
    if model_type == "xgboost":
        return treelite.frontend.load_xgboost_model_legacy_binary(path)
    if model_type in ("xgboost_json", "xgboost_ubj"):
        return treelite.frontend.load_xgboost_model(
            path, format_choice="json" if model_type == "xgboost_json" else "ubjson",
            allow_unknown_field=allow_unknown_field)
    if model_type == "lightgbm":
        return treelite.frontend.load_lightgbm_model(path)
    return treelite.Model.deserialize(path)


def _first_line(error: Exception) -> str:
    """The message of a Treelite error, without its "[time] source.cc:line:" prefix."""
    line = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return _SOURCE_PREFIX.sub("", line).strip()
