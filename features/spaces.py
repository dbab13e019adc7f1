"""The feature table of a measured space (`datasets.spaces.MeasuredSpace`): the one place that
featurises measured data for training and evaluation."""

from __future__ import annotations

import pandas as pd

from dispatchtune.datasets.kerneltuner import KernelTunerGemm
from dispatchtune.datasets.spaces import MeasuredSpace
from dispatchtune.errors import InputError
from dispatchtune.features.extract import extract_features
from dispatchtune.features.kerneltuner import gemm_features
from dispatchtune.problem import Problem
from dispatchtune.targets import get_target


def has_features(space: MeasuredSpace) -> bool:
    """Whether the feature vocabulary covers the space (not: a non-GEMM Kernel Tuner cache)."""
    return isinstance(space.problem, (Problem, KernelTunerGemm))


def space_features(space: MeasuredSpace) -> pd.DataFrame:
    """Columns `FEATURE_NAMES`, one row per valid candidate of the space (same index).

    A log is featurised for the target and CPU it was measured on (`space.device`).
    """
    if isinstance(space.problem, Problem):
        return extract_features(space.problem, get_target(space.device), space.table)
    if isinstance(space.problem, KernelTunerGemm):
        return gemm_features(space.table, space.problem, space.device)
    raise InputError(f"{space.label}: no feature mapping for this space ({space.source})")
