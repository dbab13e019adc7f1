"""Kernel Tuner's strategies replayed for real (simulation mode) on slices of measured caches."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("kernel_tuner")

from dispatchtune.benchmarks.kerneltuner_peers import (
    COLUMNS,
    kernel_tuner_rows,
    replay_evaluations,
)
from dispatchtune.errors import InputError

FIXTURES = Path(__file__).parent / "fixtures"
GEMM = FIXTURES / "kt_gemm_2080ti_slice.json.gz"  # 200 configurations, all ran
CONV = FIXTURES / "kt_conv_a4000_slice.json.gz"  # 20 configurations, 4 failed at run time
THRESHOLD = 0.05


def _cache_times(path: Path) -> dict[str, float]:
    """Kernel Tuner's cache key -> time (inf when failed), read straight from the file."""
    data = json.loads(gzip.decompress(path.read_bytes()))
    return {
        key: float(entry["time"]) if isinstance(entry["time"], (int, float)) else float("inf")
        for key, entry in data["cache"].items()
    }


@pytest.fixture(scope="module")
def gemm_rows() -> pd.DataFrame:
    return kernel_tuner_rows(GEMM, ["genetic_algorithm", "dual_annealing"], [0, 1], max_fevals=80,
                             progress=False)


def test_columns_and_space_counts(gemm_rows: pd.DataFrame) -> None:
    times = _cache_times(GEMM)
    valid = np.array([t for t in times.values() if np.isfinite(t)])
    n_good = int((valid <= valid.min() * (1 + THRESHOLD)).sum())
    assert tuple(gemm_rows.columns) == COLUMNS
    assert len(gemm_rows) == 4
    assert sorted(set(gemm_rows["order"])) == ["kt_dual_annealing", "kt_genetic_algorithm"]
    assert set(gemm_rows["problem"]) == {"NVIDIA GeForce RTX 2080 Ti GEMM 4096x4096x4096"}  # harness label
    assert set(gemm_rows["device"]) == {"NVIDIA GeForce RTX 2080 Ti"}
    assert set(gemm_rows["n_candidates"]) == {len(valid)}
    assert set(gemm_rows["n_good"]) == {n_good} and n_good >= 1
    assert np.allclose(gemm_rows["random_expected"], (len(valid) + 1) / (n_good + 1))


def test_counts_are_consistent(gemm_rows: pd.DataFrame) -> None:
    for row in gemm_rows.to_dict("records"):
        curve = json.loads(row["best_so_far"])
        assert 1 <= row["evaluated"] <= 80
        assert len(curve) == row["evaluated"]
        assert all(0 < a <= b <= 1 for a, b in itertools.pairwise(curve))  # best / best so far
        assert row["invalid_proposals"] == 0  # this slice has no failed configuration
        if np.isnan(row["benchmarks_to_threshold"]):
            assert max(curve) < 1 / (1 + THRESHOLD)
        else:
            hit = int(row["benchmarks_to_threshold"])
            assert 1 <= hit <= row["evaluated"]
            assert curve[hit - 1] >= 1 / (1 + THRESHOLD) - 1e-4  # rounded to 4 places
            assert hit == 1 or curve[hit - 2] < 1 / (1 + THRESHOLD)
    # The genetic algorithm finds a near-optimal configuration in 80 of 200 for both seeds.
    ga = gemm_rows[gemm_rows["order"] == "kt_genetic_algorithm"]
    assert ga["benchmarks_to_threshold"].notna().all()


def test_hit_is_near_optimal_in_the_cache(gemm_rows: pd.DataFrame) -> None:
    times = _cache_times(GEMM)
    best = min(times.values())
    row = gemm_rows[(gemm_rows["order"] == "kt_genetic_algorithm") & (gemm_rows["seed"] == 0)].iloc[0]
    trace = replay_evaluations(GEMM, "genetic_algorithm", 0, max_fevals=80)
    keys = [key for key, _ in trace]
    assert len(keys) == len(set(keys)) == row["evaluated"]
    # Every time the replay reports is the cache's time for that configuration.
    assert all(times[key] == time for key, time in trace)
    hit = int(row["benchmarks_to_threshold"])
    assert times[keys[hit - 1]] <= best * (1 + THRESHOLD)
    assert all(times[key] > best * (1 + THRESHOLD) for key in keys[: hit - 1])


def test_failed_configurations_cost_benchmarks() -> None:
    times = _cache_times(CONV)
    rows = kernel_tuner_rows(CONV, ["genetic_algorithm"], [0, 1], max_fevals=20, progress=False)
    assert set(rows["n_candidates"]) == {16}
    for row in rows.to_dict("records"):
        trace = replay_evaluations(CONV, "genetic_algorithm", int(row["seed"]), max_fevals=20)
        assert len(trace) == row["evaluated"]
        b2t = row["benchmarks_to_threshold"]
        end = len(trace) if np.isnan(b2t) else int(b2t)
        failed = sum(1 for key, _ in trace[:end] if not np.isfinite(times[key]))
        assert row["invalid_proposals"] == failed
        curve = json.loads(row["best_so_far"])
        # 0 (no configuration ran yet) exactly while only failed ones were benchmarked
        first_ok = next(i for i, (key, _) in enumerate(trace) if np.isfinite(times[key]))
        assert curve[:first_ok] == [0.0] * first_ok and curve[first_ok] > 0
    assert rows["invalid_proposals"].sum() > 0  # seed 0 benchmarks two failed configurations first


@pytest.mark.parametrize("strategy", ["genetic_algorithm", "bayes_opt"])
def test_same_seed_same_run(strategy: str) -> None:
    # bayes_opt draws its initial sample from an unseeded scipy generator unless the replay seeds it.
    first = kernel_tuner_rows(GEMM, [strategy], [3], max_fevals=40, progress=False)
    again = kernel_tuner_rows(GEMM, [strategy], [3], max_fevals=40, progress=False)
    pd.testing.assert_frame_equal(first, again)


def test_stop_at_hit_keeps_the_count() -> None:
    full = kernel_tuner_rows(GEMM, ["genetic_algorithm"], [0, 1], max_fevals=80, progress=False)
    cut = kernel_tuner_rows(GEMM, ["genetic_algorithm"], [0, 1], max_fevals=80, progress=False,
                            stop_at_hit=["genetic_algorithm"])
    pd.testing.assert_series_equal(full["benchmarks_to_threshold"], cut["benchmarks_to_threshold"])
    assert (cut["evaluated"] <= full["evaluated"]).all()
    for a, b in zip(full["best_so_far"], cut["best_so_far"], strict=True):
        shorter = json.loads(b)
        assert json.loads(a)[: len(shorter)] == shorter


def test_bad_input_is_one_line() -> None:
    with pytest.raises(InputError, match="unknown Kernel Tuner strategy 'annealing'"):
        kernel_tuner_rows(GEMM, ["annealing"], [0], progress=False)
    with pytest.raises(InputError, match="not found"):
        kernel_tuner_rows(FIXTURES / "missing.json.gz", ["pso"], [0], progress=False)


def test_peers_checkpoint_replays_only_missing_runs(tmp_path: Path) -> None:
    from dispatchtune.benchmarks.peers import kernel_tuner_part

    first = kernel_tuner_part([GEMM], ["genetic_algorithm"], [0, 1], THRESHOLD, 40, tmp_path, False)
    checkpoint = tmp_path / "kerneltuner_rows.csv"
    assert len(pd.read_csv(checkpoint)) == 2
    more = kernel_tuner_part([GEMM], ["genetic_algorithm"], [0, 1, 2], THRESHOLD, 40, tmp_path, False)
    assert len(pd.read_csv(checkpoint)) == 3  # seeds 0 and 1 reused, seed 2 appended
    assert sorted(more["seed"]) == [0, 1, 2]
    kept = more[more["seed"] < 2].sort_values("seed").reset_index(drop=True)
    pd.testing.assert_frame_equal(kept[["seed", "benchmarks_to_threshold", "evaluated", "best_so_far"]],
                                  first[["seed", "benchmarks_to_threshold", "evaluated", "best_so_far"]])
    # Other settings start afresh rather than mixing counts made under another threshold.
    kernel_tuner_part([GEMM], ["genetic_algorithm"], [0], 0.10, 40, tmp_path, False)
    assert len(pd.read_csv(checkpoint)) == 1


def test_peers_harness_checkpoint_replays_only_missing_orders(tmp_path: Path) -> None:
    from dispatchtune.benchmarks.peers import harness_part

    first = harness_part([GEMM, CONV], ["random"], [0, 1], THRESHOLD, 50, tmp_path)
    checkpoint = tmp_path / "harness_rows.csv"
    assert len(pd.read_csv(checkpoint)) == 4  # two spaces x two seeds
    both = harness_part([GEMM, CONV], ["random", "heuristic"], [0, 1], THRESHOLD, 50, tmp_path)
    stored = pd.read_csv(checkpoint)
    assert (stored["order"] == "random").sum() == 4  # read back, not replayed
    assert (stored["order"] == "heuristic").sum() == 4
    assert sorted(both["order"].unique()) == ["heuristic", "random"]
    again = both[both["order"] == "random"].reset_index(drop=True)
    pd.testing.assert_frame_equal(again, first)  # the CSV round trip keeps values and dtypes
    # Another seed makes the order incomplete: it is replayed and the later rows win.
    more = harness_part([GEMM, CONV], ["random"], [0, 1, 2], THRESHOLD, 50, tmp_path)
    assert len(more) == 6 and sorted(set(more["seed"])) == [0, 1, 2]
    # Other settings start afresh.
    harness_part([GEMM], ["random"], [0], 0.10, 50, tmp_path)
    assert len(pd.read_csv(checkpoint)) == 1


def test_peers_summary_counts_misses_last() -> None:
    from dispatchtune.benchmarks.peers import summarize

    rows = pd.DataFrame({
        "problem": ["p"] * 6, "order": ["a"] * 3 + ["b"] * 3,
        "benchmarks_to_threshold": [10.0, np.nan, 30.0, np.nan, np.nan, 5.0],
        "random_expected": [50.0] * 6, "invalid_proposals": [0, 2, 1, 0, 0, 0],
        "evaluated": [100, 100, 100, 7, 8, 5],
    })
    table = summarize(rows).set_index("order")
    assert table.loc["a", "hit_rate"] == pytest.approx(2 / 3)
    assert table.loc["a", "median"] == "30.0"  # the miss sorts after both hits
    assert table.loc["a", "median_of_hits"] == 20.0
    assert table.loc["b", "median"] == "miss"
    assert table.loc["b", "median_evaluated"] == 7.0


def test_a_rate_tuned_cache_is_replayed_on_its_rate(tmp_path: Path) -> None:
    # The peers minimise what the harness does: 1 / GFLOP/s for a cache tuned for GFLOP/s.
    entries = {str(tf): {"tf": tf, "time": 1.0 + tf / 4, "GFLOP/s": 10.0 * tf} for tf in range(1, 9)}
    cache = tmp_path / "rate.json"
    cache.write_text(json.dumps({
        "device_name": "AMD Instinct MI250X", "kernel_name": "calculate_temp", "problem_size": [64],
        "tune_params_keys": ["tf"], "tune_params": {"tf": list(range(1, 9))}, "objective": "GFLOP/s",
        "cache": entries}))
    trace = replay_evaluations(cache, "random_sample", 0, max_fevals=8)  # every configuration
    assert {key: cost for key, cost in trace} == {k: 1 / (10.0 * int(k)) for k, _ in trace}
    rows = kernel_tuner_rows(cache, ["random_sample"], [0], max_fevals=8, progress=False)
    (hit,) = rows["benchmarks_to_threshold"]
    keys = [key for key, _ in trace]
    # The hit is the best rate (tf=8), never the fastest launch (tf=1).
    assert len(keys) == 8 and keys.index("8") + 1 == hit
