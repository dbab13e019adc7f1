"""`KnobHeuristicModel`: the fallback heuristic over a foreign kernel's raw knobs.

Some measured spaces come from kernels the shared feature vocabulary does not describe (Kernel
Tuner's 2-D convolution: block and tile sizes, shared-memory and padding flags), so neither the
handwritten `HeuristicModel` nor a learned model can score them. What still holds for any GPU kernel
is that memory moves in power-of-two transactions across 32-wide warps and power-of-two banks:
power-of-two block and tile sizes keep accesses aligned and coalesced, and other sizes usually
waste part of every transaction. The score counts a candidate's power-of-two size knobs; flags
(knobs with two values) and non-positive or non-integer knobs carry no opinion.

Caveat: this rule was adopted after the convolution landscape had been examined (docs/search.md),
so its figures on that space are not an out-of-sample test.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dispatchtune.costmodel.base import CostModel


def size_knobs(knobs: pd.DataFrame) -> list[str]:
    """Columns that read as sizes: positive integers with more than two distinct values."""
    return [
        name for name in knobs.columns
        if pd.api.types.is_integer_dtype(knobs[name]) and not pd.api.types.is_bool_dtype(knobs[name])
        and knobs[name].nunique() > 2 and bool((knobs[name] > 0).all())
    ]


class KnobHeuristicModel(CostModel):
    """Score = number of size knobs whose value is a power of two (higher = benchmark sooner).

    Takes the raw knob table where other models take the feature table; `fit` learns nothing.
    """

    def fit(self, features: pd.DataFrame, labels: Any, groups: Any = None) -> KnobHeuristicModel:
        return self

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        score = np.zeros(len(features))
        for name in size_knobs(features):
            values = features[name].to_numpy(dtype=np.int64)
            score += (values & (values - 1)) == 0
        return score
