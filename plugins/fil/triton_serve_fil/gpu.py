"""GPU instances: XGBoost models scored by XGBoost on a CUDA device."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from triton_serve.plugin import ServerError, Status


class XGBoostGpuScorer:
    """An XGBoost booster on ``cuda:<device_id>``; scores match ``Forest.scores``. The core has
    already checked that the GPU is visible before the instance is created."""

    def __init__(self, path: Path, device_id: int, num_scores: int) -> None:
        try:
            import xgboost
        except ImportError:
            raise ServerError("KIND_GPU instances of the fil backend run XGBoost models with XGBoost, which is "
                              "not installed: pip install 'triton-serve-fil[gpu]'", Status.UNAVAILABLE) from None
        try:
            # loading from bytes lets XGBoost tell JSON from UBJSON by content, whatever the file is named
            self.booster = xgboost.Booster(model_file=bytearray(path.read_bytes()))
        except xgboost.core.XGBoostError as error:
            raise ServerError(f"XGBoost cannot read '{path.parent.name}/{path.name}': "
                              f"{str(error).splitlines()[0]}") from None
        self.booster.set_param({"device": f"cuda:{device_id}"})
        self.num_scores = num_scores
        self._xgboost = xgboost

    def scores(self, rows: np.ndarray) -> np.ndarray:
        # a DMatrix from host rows: inplace_predict would warn about the host/device mismatch
        result = self.booster.predict(self._xgboost.DMatrix(rows), validate_features=False)
        return np.asarray(result, dtype=np.float32).reshape(rows.shape[0], self.num_scores)
