"""The development suite (`benchmarks/suite.py`): per-space tables, the comparison with the best
peer, and harness orders checkpointed space by space (fixture slices, cheap orders only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dispatchtune.benchmarks.suite import comparison, harness_rows, space_table

FIXTURES = Path(__file__).parent / "fixtures"
SPACES = [FIXTURES / "kt_pnpoly_titan_slice.json.gz", FIXTURES / "kt_pnpoly_2080ti_slice.json.gz"]


def _rows(problem: str, order: str, values: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"problem": problem, "order": order, "seed": range(len(values)),
                         "benchmarks_to_threshold": values, "random_expected": 50.0})


def test_tables_count_misses_as_never_and_random_as_its_expectation() -> None:
    rows = pd.concat([
        _rows("a", "random", [10, 90, 200]), _rows("a", "kt_pso", [20, 30, np.nan]),
        _rows("a", "online", [5, 8, 300]), _rows("b", "kt_pso", [np.nan, np.nan, 1]),
        _rows("b", "online", [40, 60, 70]),
    ], ignore_index=True)
    table = space_table(rows).set_index(["problem", "order"])
    assert table.loc[("a", "random"), "median"] == 50.0  # the exact expectation
    assert table.loc[("a", "kt_pso"), "median"] == 30 and table.loc[("b", "kt_pso"), "median"] == np.inf
    assert table.loc[("a", "online"), "hit@200"] == 2 / 3 and table.loc[("a", "online"), "hit@50"] == 2 / 3
    result = comparison(space_table(rows)).set_index("space")
    assert result.loc["a", "best peer"] == "kt_pso" and result.loc["a", "ratio"] == 8 / 30
    # Every run of the only peer missed: any median of ours is infinitely better.
    assert result.loc["b", "best peer"] == "kt_pso" and result.loc["b", "ratio"] == 0


def test_harness_orders_are_checkpointed_space_by_space(tmp_path: Path) -> None:
    first = harness_rows(SPACES, "knobs", [0, 1], 30, tmp_path)
    assert len(first) == 4 and set(first["order"]) == {"knobs"}
    checkpoint = tmp_path / "harness_knobs.csv"
    stamp = checkpoint.stat().st_mtime_ns
    again = harness_rows(SPACES, "knobs", [0, 1], 30, tmp_path)  # read back, not replayed
    assert checkpoint.stat().st_mtime_ns == stamp
    pd.testing.assert_frame_equal(first, again)
    # An order that does not apply (no features: no gbm) leaves a marker, not a retry.
    assert harness_rows(SPACES, "gbm", [0], 30, tmp_path).empty
    assert len(pd.read_csv(tmp_path / "harness_gbm.csv")) == 2
    fresh = harness_rows(SPACES, "knobs", [0], 30, tmp_path, fresh=True)
    assert len(fresh) == 2


def test_more_seeds_extend_the_checkpoint_and_another_cap_starts_afresh(tmp_path: Path) -> None:
    first = harness_rows(SPACES, "knobs", [0, 1], 30, tmp_path)
    more = harness_rows(SPACES, "knobs", [0, 1, 2], 30, tmp_path)  # only seed 2 is replayed
    assert len(more) == 6 and len(pd.read_csv(tmp_path / "harness_knobs.csv")) == 6
    kept = more[more["seed"] < 2].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, first)
    # Fewer seeds read back a subset; another benchmark cap is another experiment.
    assert len(harness_rows(SPACES, "knobs", [1], 30, tmp_path)) == 2
    harness_rows(SPACES, "knobs", [0], 20, tmp_path)
    assert len(pd.read_csv(tmp_path / "harness_knobs.csv")) == 2
