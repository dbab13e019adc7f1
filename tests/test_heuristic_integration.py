"""The heuristic on real enumerated candidate sets (`dispatchtune.search.enumerate_candidates`)."""

from __future__ import annotations

import numpy as np
import pytest

import dispatchtune
from dispatchtune.costmodel import HeuristicModel
from dispatchtune.features import FEATURE_NAMES, extract_features
from dispatchtune.problem import Problem
from dispatchtune.search import enumerate_candidates


@pytest.mark.parametrize(
    ("problem", "target"),
    [
        (Problem.matmul(1024, 1024, 1024, "f16", transpose_b=True), "gfx942"),
        (Problem.conv2d_nhwc_hwcf(2, 28, 28, 64, 128, 3, 3, "f16"), "gfx942"),
        (Problem.matmul(1000, 512, 256, "f16"), "gfx1100"),
    ],
    ids=["gfx942-matmul", "gfx942-conv", "gfx1100-matmul-unaligned"],
)
def test_rank_real_gpu_spaces(problem: Problem, target: str) -> None:
    cset = enumerate_candidates(problem, target)
    features = extract_features(cset.problem, cset.target, cset.table)
    assert list(features.columns) == list(FEATURE_NAMES)
    assert np.isfinite(features.to_numpy()).all()
    ranked = dispatchtune.rank(cset)
    assert sorted(ranked["candidate_id"]) == list(range(len(cset)))
    assert (np.diff(ranked["score"].to_numpy()) <= 0).all()
    # The heuristic separates the space (not one big tie) and its favourites fit the hardware:
    # no register spill, resident at all, within the shared-memory limit.
    assert ranked["score"].nunique() > 20
    top = features.loc[ranked["candidate_id"].head(10)]
    assert (top["acc_registers"] + 32 <= 256).all()
    assert (top["occupancy"] > 0).all() and (top["shared_memory_fraction"] <= 1).all()
    worst = features.loc[ranked["candidate_id"].tail(10)]
    assert worst["occupancy"].mean() < top["occupancy"].mean() or (
        worst["acc_registers"].mean() > top["acc_registers"].mean()
    )


def test_every_gpu_term_is_live_on_a_real_space_or_documented() -> None:
    """Terms constant on IREE GPU spaces are exactly the ones docs/heuristic.md says are."""
    cset = enumerate_candidates(Problem.matmul(1024, 1024, 1024, "f16", transpose_b=True), "gfx942")
    terms = HeuristicModel().term_scores(extract_features(cset.problem, cset.target, cset.table))
    constant = {name for name in terms if terms[name].nunique() == 1}
    # All tiles divide 1024 and are powers of two here; IREE picks the load width itself.
    assert constant <= {"padding", "tile_k_pow2", "vector_loads"}


@pytest.mark.parametrize(
    "problem",
    [Problem.matmul(512, 512, 512, "f32"), Problem.conv2d_nhwc_hwcf(2, 28, 28, 64, 64, 3, 3),
     Problem.batch_matmul(8, 128, 128, 256, "f32")],
    ids=["matmul", "conv", "batch-matmul"],
)
def test_rank_real_cpu_spaces(problem: Problem) -> None:
    cset = enumerate_candidates(problem, "host")
    ranked = dispatchtune.rank(cset)
    assert sorted(ranked["candidate_id"]) == list(range(len(cset)))
    # The enumerator already removes what the sanity terms punish (non-dividing tiles, spills,
    # idle cores); the heuristic must still separate the remaining space.
    assert ranked["score"].nunique() > 5
    features = extract_features(cset.problem, cset.target, cset.table)
    top = features.loc[ranked["candidate_id"].head(20)]
    assert (top["cpu_vector_count_pow2"] == 1).all()
    assert (top["vec_m"] >= 4).all() and (top["cpu_register_tile_fraction"] >= 0.25).all()
