"""Heuristic ranker: every term changes the order, terms point the right way, rank() contract."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import dispatchtune
from dispatchtune.costmodel import CPU_TERMS, GPU_TERMS, HeuristicModel, rank
from dispatchtune.costmodel.metrics import (
    benchmarks_to_near_optimal,
    expected_benchmarks_with_ties,
    near_optimal,
    random_expected_benchmarks,
)
from dispatchtune.datasets.kerneltuner import load_kerneltuner
from dispatchtune.errors import DispatchTuneError
from dispatchtune.features import extract_features
from dispatchtune.features.kerneltuner import kerneltuner_features
from dispatchtune.problem import Problem
from dispatchtune.targets import get_target

KT_FIXTURE = Path(__file__).parent / "fixtures" / "kt_gemm_2080ti_slice.json.gz"
# Terms that only act on spaces that carry the knob they read (documented in docs/heuristic.md):
# IREE GPU candidates never state global load widths, Kernel Tuner spaces have no intrinsics.
KT_ONLY_TERMS = {"vector_loads"}


def gpu_grid() -> pd.DataFrame:
    """IREE-style GPU candidates varying every knob the GPU terms read."""
    rows = []
    subgroup_layouts = [(1, 1), (1, 2), (2, 2), (1, 3), (2, 4), (4, 4)]
    mmas = [(16, 16, 16), (32, 32, 8)]
    for tm, tn, tk, (sg_m, sg_n), (mm, mn, mk) in itertools.product(
        [32, 64, 128, 256], [64, 128, 256], [32, 48, 64], subgroup_layouts, mmas
    ):
        rows.append({
            "pipeline": "TileAndFuse", "tile_b": 1, "tile_m": tm, "tile_n": tn, "tile_k": tk,
            "vec_m": tm // sg_m, "vec_n": tn // sg_n, "intrinsic": f"MFMA_{mm}x{mn}x{mk}",
            "mma_m": mm, "mma_n": mn, "mma_k": mk, "subgroups_m": sg_m, "subgroups_n": sg_n,
            "subgroup_size": 64, "workgroup_threads": sg_m * sg_n * 64, "prefetch_stages": 2,
        })
    return pd.DataFrame(rows)


def cpu_grid() -> pd.DataFrame:
    """DoubleTilingExpert candidates varying every knob the CPU terms read."""
    rows = []
    for tm, tn, tk, vm, vn in itertools.product(
        [8, 32, 100, 128, 384], [16, 64, 512], [1, 4, 16, 256], [1, 2, 6, 8, 16], [8, 16, 48, 64]
    ):
        rows.append({
            "pipeline": "DoubleTilingExpert", "tile_b": 0, "tile_m": tm, "tile_n": tn,
            "tile_k": tk, "vec_m": vm, "vec_n": vn, "intrinsic": "", "mma_m": 0, "mma_n": 0,
            "mma_k": 0, "subgroups_m": 0, "subgroups_n": 0, "subgroup_size": 0,
            "workgroup_threads": 0, "prefetch_stages": 0,
        })
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def gpu_features() -> pd.DataFrame:
    return extract_features(Problem.matmul(1100, 2048, 3072, "f16"), get_target("gfx942"),
                            gpu_grid())


@pytest.fixture(scope="module")
def cpu_features() -> pd.DataFrame:
    # AVX-512 (16 f32 lanes), whatever this machine has: the expectations below assume it.
    return extract_features(Problem.matmul(384, 512, 512, "f32"), get_target("llvm-cpu:x86-64-v4"),
                            cpu_grid())


@pytest.fixture(scope="module")
def kt_features() -> pd.DataFrame:
    return kerneltuner_features(load_kerneltuner(KT_FIXTURE))


def _order(model: HeuristicModel, features: pd.DataFrame) -> np.ndarray:
    return model.rank(features)


@pytest.mark.parametrize("term", [t.name for t in GPU_TERMS])
def test_every_gpu_term_changes_the_order(
    term: str, gpu_features: pd.DataFrame, kt_features: pd.DataFrame
) -> None:
    features = kt_features if term in KT_ONLY_TERMS else gpu_features
    full = _order(HeuristicModel(), features)
    without = _order(HeuristicModel(disabled=[term]), features)
    assert not np.array_equal(full, without), f"term {term} never changes the order"


@pytest.mark.parametrize("term", [t.name for t in CPU_TERMS])
def test_every_cpu_term_changes_the_order(term: str, cpu_features: pd.DataFrame) -> None:
    full = _order(HeuristicModel(), cpu_features)
    without = _order(HeuristicModel(disabled=[term]), cpu_features)
    assert not np.array_equal(full, without), f"term {term} never changes the order"


def _worse_gets_lower(
    features: pd.DataFrame, term: str, worse: pd.Series, better: pd.Series
) -> None:
    """The term scores every `worse` row strictly below every `better` row."""
    assert worse.any() and better.any()
    scores = HeuristicModel().term_scores(features)[term]
    assert scores[worse].max() < scores[better].min()


def test_gpu_terms_penalise_the_right_candidates(gpu_features: pd.DataFrame) -> None:
    f = gpu_features
    _worse_gets_lower(f, "padding", f["padding_waste"] > 0.1, f["padding_waste"] < 0.05)
    _worse_gets_lower(f, "tile_k_pow2", f["tile_k"] == 48, f["tile_k"] == 64)
    _worse_gets_lower(f, "simd_multiple", f["subgroups"] == 3, f["subgroups"] == 4)
    _worse_gets_lower(f, "mma_reuse", f["mma_m"] == 16, f["mma_m"] == 32)
    _worse_gets_lower(f, "register_spill", f["acc_registers"] > 256, f["acc_registers"] <= 64)
    _worse_gets_lower(f, "tile_intensity", f["wg_intensity"] < 30, f["wg_intensity"] > 33)
    _worse_gets_lower(f, "occupancy", f["occupancy"] < 0.1, f["occupancy"] >= 0.25)


def test_cpu_terms_penalise_the_right_candidates(cpu_features: pd.DataFrame) -> None:
    f = cpu_features
    _worse_gets_lower(f, "tile_remainder", f["tile_m"] == 100, f["tile_m"] == 128)
    _worse_gets_lower(f, "vector_remainder", f["vec_divides_tile"] == 0,
                      f["vec_divides_tile"] == 1)
    _worse_gets_lower(f, "register_fill", (f["vec_m"] == 1) & (f["vec_n"] == 16),
                      (f["vec_m"] == 8) & (f["vec_n"] == 16))
    _worse_gets_lower(f, "register_spill", (f["vec_m"] == 16) & (f["vec_n"] == 64),
                      (f["vec_m"] == 8) & (f["vec_n"] == 16))
    _worse_gets_lower(f, "vector_utilization", f["vec_n"] == 8, f["vec_n"] == 16)
    _worse_gets_lower(f, "vector_pow2", f["vec_n"] == 48, f["vec_n"] == 64)
    _worse_gets_lower(f, "rhs_reuse", f["vec_m"] == 1, f["vec_m"] == 8)
    # Saturates at 8 rows, not 4 (docs/heuristic.md "rhs_reuse saturates at 8 rows").
    _worse_gets_lower(f, "rhs_reuse", f["vec_m"] == 6, f["vec_m"] == 8)
    assert (HeuristicModel().term_scores(f[f["vec_m"] >= 8])["rhs_reuse"] == 0).all()
    _worse_gets_lower(f, "parallelism", f["workgroups"] == 1, f["workgroups"] >= 2)
    _worse_gets_lower(f, "l1_footprint", f["cpu_l1_footprint_fraction"] > 1.5,
                      f["cpu_l1_footprint_fraction"] < 1)


def test_measured_cpu_pathologies_rank_last(cpu_features: pd.DataFrame) -> None:
    """The slow configs measured on this machine (1x16, 2x8 register tiles; vec 6 over 128; a
    non-dividing distribution) score below the fast 8x16 one (docs/heuristic.md)."""
    f = cpu_features
    scores = pd.Series(HeuristicModel().predict(f), index=f.index)

    def score(tm: int, tn: int, tk: int, vm: int, vn: int) -> float:
        mask = (f["tile_m"] == tm) & (f["tile_n"] == tn) & (f["tile_k"] == tk)
        mask &= (f["vec_m"] == vm) & (f["vec_n"] == vn)
        return float(scores[mask].iloc[0])

    good = score(128, 64, 16, 8, 16)
    for slow in [(128, 64, 1, 1, 16), (128, 64, 1, 2, 8), (128, 64, 1, 6, 16),
                 (100, 64, 16, 8, 16)]:
        assert score(*slow) < good


def test_heuristic_beats_random_on_real_kernel_tuner_measurements(
    kt_features: pd.DataFrame,
) -> None:
    times = load_kerneltuner(KT_FIXTURE).table["time_ms"].to_numpy()
    n, k = len(times), int(near_optimal(times).sum())
    heuristic = expected_benchmarks_with_ties(HeuristicModel().predict(kt_features), times)
    assert heuristic < random_expected_benchmarks(n, k) / 2


@pytest.mark.parametrize(
    ("problem", "target", "table"),
    [
        (Problem.matmul(1100, 2048, 3072, "f16"), "gfx942", gpu_grid),
        (Problem.conv2d_nhwc_hwcf(2, 28, 28, 64, 128, 3, 3, "f16"), "gfx942", gpu_grid),
        (Problem.attention(2, 1024, 64, 64, 1024, "f16"), "gfx942", gpu_grid),
        (Problem.matmul(384, 512, 512, "f32"), "host", cpu_grid),
        (Problem.conv2d_nhwc_hwcf(1, 28, 28, 64, 64, 3, 3), "host", cpu_grid),
    ],
    ids=["gpu-matmul", "gpu-conv", "gpu-attention", "cpu-matmul", "cpu-conv"],
)
def test_rank_orders_every_kind(problem: Problem, target: str, table) -> None:  # type: ignore[no-untyped-def]
    candidates = table()
    ranked = rank(candidates, problem, target, order="heuristic")
    assert len(ranked) == len(candidates)
    assert sorted(ranked["candidate_id"]) == list(range(len(candidates)))
    scores = ranked["score"].to_numpy()
    assert (np.diff(scores) <= 0).all() and scores[0] > scores[-1]
    # Ranked rows are the original rows, reordered.
    original = candidates.iloc[ranked["candidate_id"].to_numpy()].reset_index(drop=True)
    pd.testing.assert_frame_equal(ranked[candidates.columns], original)


def test_rank_accepts_a_candidate_set_and_is_exported_at_top_level() -> None:
    problem = Problem.matmul(384, 512, 512, "f32")
    cset = SimpleNamespace(problem=problem, target=get_target("host"), table=cpu_grid())
    via_set = dispatchtune.rank(cset)
    via_frame = rank(cpu_grid(), problem, "host")
    pd.testing.assert_frame_equal(via_set, via_frame)


def test_random_order_is_seeded_permutation() -> None:
    table = cpu_grid()
    first = rank(table, order="random", seed=3)
    again = rank(table, order="random", seed=3)
    other = rank(table, order="random", seed=4)
    pd.testing.assert_frame_equal(first, again)
    assert not first["candidate_id"].equals(other["candidate_id"])
    assert sorted(first["candidate_id"]) == list(range(len(table)))
    assert (np.diff(first["score"].to_numpy()) <= 0).all()


def test_rank_bad_input() -> None:
    with pytest.raises(DispatchTuneError, match="unknown order"):
        rank(cpu_grid(), Problem.matmul(8, 8, 8), "host", order="best")
    with pytest.raises(DispatchTuneError, match="needs the problem"):
        rank(cpu_grid())
    with pytest.raises(DispatchTuneError, match="CandidateSet or DataFrame"):
        rank([1, 2, 3], Problem.matmul(8, 8, 8), "host")
    with pytest.raises(DispatchTuneError, match="unknown heuristic term"):
        HeuristicModel(disabled=["speed"])
    empty = rank(cpu_grid().iloc[:0], Problem.matmul(8, 8, 8), "host")
    assert len(empty) == 0 and "score" in empty


def test_metrics_are_exact() -> None:
    assert random_expected_benchmarks(99, 9) == 10
    times = [5.0, 1.0, 1.04, 2.0]
    assert benchmarks_to_near_optimal(times) == 2
    # Scores: two tied at the top (one of them good) -> (2 + 1) / (1 + 1) = 1.5.
    assert expected_benchmarks_with_ties([1, 1, 0, 0], [1.0, 9.0, 1.0, 9.0]) == 1.5
    assert expected_benchmarks_with_ties([3, 2, 1, 0], [9.0, 9.0, 1.0, 1.0]) == 3
    with pytest.raises(DispatchTuneError):
        random_expected_benchmarks(3, 0)
    with pytest.raises(DispatchTuneError):
        benchmarks_to_near_optimal([])


def test_heuristic_ties_are_broken_by_the_seed_only() -> None:
    problem = Problem.matmul(384, 512, 512, "f32")
    first = rank(cpu_grid(), problem, "host", seed=1)
    again = rank(cpu_grid(), problem, "host", seed=1)
    other = rank(cpu_grid(), problem, "host", seed=2)
    pd.testing.assert_frame_equal(first, again)
    # Another seed reorders tied candidates only: the score sequence is the same.
    np.testing.assert_array_equal(first["score"], other["score"])
    assert not first["candidate_id"].equals(other["candidate_id"])


def test_docs_list_every_term_with_its_formula() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "heuristic.md").read_text()
    for term in (*GPU_TERMS, *CPU_TERMS):
        assert f"| `{term.name}` | `{term.formula}` |" in text, term.name


def test_knob_heuristic_counts_power_of_two_sizes_only() -> None:
    from dispatchtune.costmodel.knob_heuristic import KnobHeuristicModel, size_knobs

    knobs = pd.DataFrame({
        "block": [32, 48, 64, 96],        # size: 32 and 64 are powers of two
        "tile": [1, 3, 2, 4],             # size: 1, 2, 4 are
        "flag": [1, 0, 1, 0],             # two values: a switch, no opinion
        "offset": [0, 1, 2, 3],           # not positive: no opinion
        "ratio": [0.5, 1.0, 2.0, 4.0],    # not integer: no opinion
        "layout": ["a", "b", "c", "d"],
    })
    assert size_knobs(knobs) == ["block", "tile"]
    model = KnobHeuristicModel()
    assert model.fit(knobs, None) is model
    assert model.predict(knobs).tolist() == [2.0, 0.0, 2.0, 1.0]
    assert model.rank(knobs).tolist() == [0, 2, 3, 1]


def test_the_shipped_cpu_samples_are_featurised_for_the_cpu_they_ran_on() -> None:
    """The random-order CPU logs behind docs/heuristic.md were measured on an AVX-512 CPU: every
    record says so, so the documented figures do not depend on the CPU of the machine reading
    them (featurised for an AVX2 reader, the heuristic looked worse than random on half of them)."""
    from dispatchtune.datasets.spaces import load_spaces

    samples = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "cpu_random_samples"
    spaces = load_spaces(sorted(str(d) for d in samples.iterdir() if d.is_dir()), "median_ms")
    assert len(spaces) == 7 and {s.cpu for s in spaces} == {"znver4"}
    assert {s.device for s in spaces} <= {"host", "llvm-cpu:znver4"}
