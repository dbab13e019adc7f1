"""Ordering quality on measured spaces: benchmarks until the first near-optimal candidate.

With N valid candidates of which k are within `threshold` of the best, a uniformly random order
needs (N + 1) / (k + 1) benchmarks on average (sampling without replacement); an ordering is
reported against that exact figure, never against a simulated random run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dispatchtune.errors import InputError


def _times(times: Any) -> np.ndarray:
    values = np.asarray(times, dtype=np.float64)
    if values.ndim != 1 or values.size == 0 or not np.isfinite(values).all():
        raise InputError("times must be a non-empty 1-D array of finite measurements")
    return values


def near_optimal(times: Any, threshold: float = 0.05) -> np.ndarray:
    """Mask of the candidates within `threshold` (0.05 = 5%) of the fastest."""
    values = _times(times)
    return values <= values.min() * (1.0 + threshold)


def random_expected_benchmarks(n: int, k: int) -> float:
    """Exact mean benchmarks a random order needs to hit one of k good among n: (n+1)/(k+1)."""
    if not 1 <= k <= n:
        raise InputError(f"need 1 <= k <= n, got n={n}, k={k}")
    return (n + 1) / (k + 1)


def benchmarks_to_near_optimal(times_in_order: Any, threshold: float = 0.05) -> int:
    """1-based position of the first candidate within `threshold` of the best, in the given order."""
    hits = near_optimal(times_in_order, threshold)
    return int(np.argmax(hits)) + 1


def expected_benchmarks_with_ties(scores: Any, times: Any, threshold: float = 0.05) -> float:
    """Exact mean position of the first near-optimal candidate when equal scores are benchmarked
    in uniformly random order (higher scores first).

    Candidates in better score groups come first; inside the first group holding h near-optimal
    of g candidates, the expected extra cost is (g + 1) / (h + 1).
    """
    score = np.asarray(scores, dtype=np.float64)
    hits = near_optimal(times, threshold)
    if score.shape != hits.shape:
        raise InputError(f"{score.size} scores for {hits.size} times")
    score = np.where(np.isnan(score), -np.inf, score)
    levels, inverse = np.unique(-score, return_inverse=True)  # ascending -score = best first
    sizes = np.bincount(inverse, minlength=levels.size)
    good = np.bincount(inverse, weights=hits.astype(np.float64), minlength=levels.size)
    first = int(np.argmax(good > 0))
    before = float(sizes[:first].sum())
    return before + (sizes[first] + 1.0) / (good[first] + 1.0)
