"""`CostModel`: the one interface every ranking model implements (handwritten or learned).

Scikit-learn style with plain arrays: `fit(features, labels, groups)` learns from measured
candidates (labels: anything where higher means faster, e.g. best time / time; groups: the problem
each row belongs to), `predict(features)` returns one score per row (higher = predicted faster), and
`rank(features)` turns the scores into a benchmark order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import pandas as pd

from dispatchtune.costmodel.order import order_by_score
from dispatchtune.errors import InputError


class CostModel(ABC):
    """Scores candidates from their feature table; higher scores are benchmarked first."""

    @abstractmethod
    def fit(self, features: pd.DataFrame, labels: Any, groups: Any = None) -> CostModel:
        """Learn from measured rows; returns self."""

    @abstractmethod
    def predict(self, features: pd.DataFrame) -> np.ndarray:
        """One float per row; higher means predicted faster."""

    def predict_candidates(self, features: pd.DataFrame, table: pd.DataFrame | None) -> np.ndarray:
        """Scores of one candidate set, given its feature table and its candidate table.

        Most models read the features only; a model that also reads candidate columns the
        features do not carry (the pairwise GPU prior: the pipeline) overrides this.
        """
        return self.predict(features)

    def rank(self, features: pd.DataFrame) -> np.ndarray:
        """Row positions in benchmark order: descending score, ties kept in input order."""
        scores = np.asarray(self.predict(features), dtype=np.float64)
        if scores.shape != (len(features),):
            raise InputError(f"model returned {scores.shape} scores for {len(features)} rows")
        return order_by_score(scores)
