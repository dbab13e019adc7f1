"""`benchmarks/measured_order.py`: candidate orders against GEMM candidates measured on an MI300X."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dispatchtune.benchmarks.measured_order import (
    BUDGETS,
    failed_builds,
    measured_rows,
    problem_of,
    random_best_after,
)

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "benchmarks" / "data" / "measured"
F8 = MEASURED / "square_gemm_2048_2048_2048_f8E4M3FNUZ_f32_tB.csv"


def test_the_gemm_a_measurement_file_is_named_after() -> None:
    f16 = problem_of(Path("square_gemm_4096_4096_4096_f16_f32_tB.csv"))
    assert f16.gemm_shape == (1, 4096, 4096, 4096)
    assert f16.element_types == ("f16", "f16", "f32")
    assert "(d1, d2)" in f16.indexing_maps[1]  # B stored N x K
    i8 = problem_of(Path("unet_gemm_4096_640_640_i8_i32_tB.csv"))
    assert i8.gemm_shape == (1, 4096, 640, 640) and i8.element_types == ("i8", "i8", "i32")
    assert problem_of(F8).element_types == ("f8E4M3FNUZ", "f8E4M3FNUZ", "f32")
    with pytest.raises(ValueError, match="in the name"):
        problem_of(Path("results.csv"))


def test_the_expected_best_of_k_random_benchmarks() -> None:
    """Exact on three candidates: the best of 2 of {1, 2, 3} is 1 in two draws of three and 2 in
    one; a failed candidate takes a turn and gives nothing (counted as the slowest measured)."""
    one, two = BUDGETS.index(1), BUDGETS.index(5)
    curve = random_best_after(np.array([1.0, 2.0, 3.0]), 1.0)
    assert curve[one] == pytest.approx(2.0) and curve[two] == pytest.approx(1.0)  # k > n: all
    failed = random_best_after(np.array([1.0, np.nan, 3.0]), 1.0)
    assert failed[one] == pytest.approx((1 + 3 + 3) / 3)
    # Against a brute-force mean over every pair drawn from four times.
    times = np.array([4.0, 1.5, 2.0, 8.0])
    pairs = [min(a, b) for i, a in enumerate(times) for b in times[i + 1:]]
    assert random_best_after(times, 1.5)[one] == pytest.approx(times.mean() / 1.5)
    assert math.isclose(np.mean(pairs) / 1.5, _best_of(times, 2) / 1.5)


def _best_of(times: np.ndarray, k: int) -> float:
    ranked = np.sort(times)
    n = len(ranked)
    return sum(math.comb(n - i, k - 1) * ranked[i - 1] for i in range(1, n + 1)) / math.comb(n, k)


def test_failed_builds_are_counted_up_to_the_last_benchmark() -> None:
    """An order meets the builds that fail among its candidates up to its k-th that builds."""
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    compiled = np.array([False, True, False, True, True])
    assert failed_builds(scores, compiled, benchmarks=1) == 1
    assert failed_builds(scores, compiled, benchmarks=2) == 2
    assert failed_builds(scores, compiled, benchmarks=50) == 2  # fewer built than asked: all


def test_measured_rows_read_as_candidate_table_columns() -> None:
    rows = measured_rows(F8)
    assert len(rows) == 967  # candidate 0, the tuner's baseline, has no configuration
    assert set(rows["pipeline"]) == {"VectorDistribute"}
    assert (rows["workgroup_threads"] == 64 * rows["subgroups_m"] * rows["subgroups_n"]).all()
    assert rows["time_us"].notna().sum() == 956  # 11 failed to compile
    assert rows["time_us"].min() == pytest.approx(61.33)
    # Times over the same device's baseline: candidate 585 (61.33 of 70.17) leads 227 (of 68.5).
    assert rows["candidate_id"].to_numpy()[np.nanargmin(rows["relative"].to_numpy())] == 585


def test_measured_order_command_as_the_docs_show(tmp_path: Path) -> None:
    """The command on one measured GEMM, its whole space: every measured candidate is in it (IREE's
    tuner and dispatchtune enumerate the same constraints), and the installed prior finds the
    fastest far earlier than a random order."""
    data = tmp_path / "measured"
    data.mkdir()
    shutil.copy(F8, data)
    proc = subprocess.run(
        [sys.executable, "benchmarks/measured_order.py", str(data), "-o", str(tmp_path / "out"),
         "--no-heuristic-filters", "--cache", str(tmp_path / "cache")],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "budgets.png").stat().st_size > 0
    row = next(line for line in report.splitlines() if line.startswith(f"| {F8.name} | 2718 "))
    assert "| 967 (956, 956) | 967 (956, 956) |" in row  # measured, in the space (built, ran)
    cells = [c.strip() for c in row.strip("|").split("|")]
    model_position = float(cells[5].split("/")[1])
    random_position = float(cells[7].split("/")[1])
    assert model_position < random_position / 4
    curves = pd.DataFrame([
        [c.strip() for c in line.strip("|").split("|")] for line in report.splitlines()
        if line.startswith(f"| {F8.name} | ") and line.count("|") == len(BUDGETS) + 4])
    assert set(curves[1]) == {"model", "heuristic", "random", "tuner"}
    values = curves.iloc[:, 2:2 + len(BUDGETS)].astype(float).to_numpy()
    assert (values >= 1.0).all() and (np.diff(values, axis=1) <= 1e-9).all()  # never worse with k
    # `--model FILE` as the docs show it: the installed prior's own file gives the same row.
    installed = ROOT / "costmodel" / "models" / "gfx942.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/measured_order.py", str(data), "-o", str(tmp_path / "file"),
         "--no-heuristic-filters", "--cache", str(tmp_path / "cache"), "--orders", "model",
         "--model", str(installed)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    again = next(line for line in (tmp_path / "file" / "report.md").read_text().splitlines()
                 if line.startswith(f"| {F8.name} | 2718 "))
    assert [c.strip() for c in again.strip("|").split("|")][5] == cells[5]
    proc = subprocess.run(
        [sys.executable, "benchmarks/measured_order.py", str(data), "-o", str(tmp_path / "x"),
         "--model", str(tmp_path / "missing.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "missing.json" in proc.stderr


def test_a_model_file_ranks_as_the_installed_prior_does_when_it_is_that_prior(
        tmp_path: Path) -> None:
    """`--model FILE`: the installed gfx942 prior read from its file scores every candidate as the
    installed default does (the option swaps the model, nothing else)."""
    from dispatchtune.benchmarks.expert_order import (
        TARGET,
        candidate_table,
        model_file_scorer,
        model_scores,
    )
    from dispatchtune.costmodel.defaults import default_model_path
    from dispatchtune.targets import get_target

    problem = problem_of(F8)
    table = candidate_table(problem, tmp_path, heuristic_filters=False)
    target = get_target(TARGET)
    path = default_model_path(TARGET)
    assert path is not None
    scores = model_file_scorer(path)(problem, table, target)
    assert len(scores) == len(table) and np.unique(scores).size > 100
    np.testing.assert_array_equal(scores, model_scores(problem, table, target))


def test_measured_order_bad_input_is_one_line(tmp_path: Path) -> None:
    """An empty directory is one line; unreadable files are a warning each, never a traceback."""
    def run(directory: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "benchmarks/measured_order.py", str(directory), "-o",
             str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=120)

    proc = run(tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a_gemm_64_64_64_f16_f32_tB.csv").write_text("a,b\n1,2\n")
    (bad / "b_gemm_64_64_64_f16_f32_tB.csv").write_bytes(bytes(range(128, 256)))
    (bad / "c_gemm_64_64_64_f16_f32_tB.csv").write_text("")
    (bad / "results.csv").write_text("x\n")
    proc = run(bad)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(lines) == 5 and lines[-1] == "error: no measurement file could be read"
    assert "no column 'mma'" in proc.stderr and "in the name" in proc.stderr
