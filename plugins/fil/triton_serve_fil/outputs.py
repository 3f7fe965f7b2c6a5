"""How Triton's FIL backend turns a forest's scores into ``output__0``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OutputRule:
    """Triton FIL's output semantics for one model.

    - not a classifier: the scores themselves (regression values, or a classifier's probabilities);
    - classifier, ``predict_proba``: per-class probabilities; a binary model's single probability p
      becomes ``[1 - p, p]`` when ``output__0`` has 2 columns, or stays ``p`` with 1 column;
    - classifier, no ``predict_proba``: the class as a float: ``p > threshold`` for a binary model,
      the most probable class otherwise.
    """

    num_scores: int
    is_classifier: bool
    predict_proba: bool
    threshold: float

    def widths(self) -> tuple[int, ...]:
        """The ``output__0`` dims this rule can fill; auto-complete uses the first."""
        if self.is_classifier and not self.predict_proba:
            return (1,)
        if self.is_classifier and self.num_scores == 1:
            return (2, 1)
        return (self.num_scores,)

    def apply(self, scores: np.ndarray, width: int) -> np.ndarray:
        """``output__0`` for (rows, num_scores) FP32 scores, with ``width`` columns (one of ``widths()``)."""
        if not self.is_classifier:
            return scores
        if self.predict_proba:
            if self.num_scores == 1 and width == 2:
                return np.concatenate([1.0 - scores, scores], axis=1)
            return scores
        if self.num_scores == 1:
            return (scores > self.threshold).astype(np.float32)
        return np.argmax(scores, axis=1).astype(np.float32).reshape(-1, 1)
