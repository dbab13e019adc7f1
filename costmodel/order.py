"""Scores to a benchmark order: the one rule every ranking (static, replayed, online prior) uses."""

from __future__ import annotations

from typing import Any

import numpy as np


def order_by_score(scores: Any, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Row positions in benchmark order: highest score first, NaN scores last.

    Ties are broken by a seeded uniform draw (`seed`: an int, or a generator to draw from), not
    by input order: solver order clusters similar candidates, so a tied block in that order can
    hide the good ones. `seed=None` keeps ties in input order.
    """
    values = np.asarray(scores, dtype=np.float64)
    keyed = -np.where(np.isnan(values), -np.inf, values)
    if seed is None:
        return np.argsort(keyed, kind="stable")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return np.lexsort((rng.random(len(values)), keyed))
