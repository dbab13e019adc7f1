"""Record-level timing metrics: one time from a measurement's repetitions, and the speedup.

The one definition of both, used by the loop's progress line, its report, `records_frame` and the
online search's import of logged results.
"""

from __future__ import annotations

from typing import Any, overload

import numpy as np

ESTIMATORS = ("min", "median")


def estimate(values: Any, estimator: str = "min") -> float:
    """One time from a measurement's repetitions (NaN when there are none).

    `min` (the default) because the noise here is one-sided: measured on this shared VM, single
    repetitions of the same binary jumped from 2.5 to 7-9 ms while other jobs ran, moving medians
    by 2x, whereas the minimum of each measurement stayed within a few percent.
    """
    if not isinstance(values, (list, tuple, np.ndarray)) or len(values) == 0:
        return float("nan")
    arr = np.asarray(values, dtype=float)
    return float(arr.min() if estimator == "min" else np.median(arr))


@overload
def speedup(baseline_ms: float, candidate_ms: float) -> float: ...
@overload
def speedup(baseline_ms: float | np.ndarray, candidate_ms: np.ndarray) -> np.ndarray: ...
@overload
def speedup(baseline_ms: np.ndarray, candidate_ms: float | np.ndarray) -> np.ndarray: ...
def speedup(baseline_ms: Any, candidate_ms: Any) -> Any:
    """Speedup over the compiler default: baseline time / candidate time (> 1 is faster).

    Elementwise on arrays; NaN where either time is NaN (not measured).
    """
    base = np.asarray(baseline_ms, dtype=np.float64)
    cand = np.asarray(candidate_ms, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = base / cand
    return float(ratio) if ratio.ndim == 0 else ratio
