"""The evaluation harness on real measured spaces (a Kernel Tuner slice and two CPU logs)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dispatchtune.cli import main as cli_main
from dispatchtune.costmodel.knob_heuristic import KnobHeuristicModel, size_knobs
from dispatchtune.errors import InputError
from dispatchtune.evaluation.harness import (
    COLUMNS,
    _Models,
    _online_priors,
    hit_budgets,
    load_replay_spaces,
    replay_spaces,
    write_report,
)
from dispatchtune.features.kerneltuner import same_architecture
from dispatchtune.search.online import _spearman

FIXTURES = Path(__file__).parent / "fixtures"
DATASETS = [
    FIXTURES / "kt_gemm_2080ti_slice.json.gz",
    FIXTURES / "cpu_results_matmul_256x384x256.jsonl",
    FIXTURES / "cpu_results_conv_2x14x14x128.jsonl",
]


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    spaces = load_replay_spaces(DATASETS)
    return replay_spaces(spaces, ["random", "heuristic", "gbm", "online", "tpe"], range(3),
                         max_benchmarks=200, progress=False)


def test_rows_are_consistent_with_the_measured_spaces(rows: pd.DataFrame) -> None:
    spaces = {s.problem: s for s in load_replay_spaces(DATASETS)}
    assert list(rows.columns) == list(COLUMNS)
    assert set(rows["order"]) == {"random", "heuristic", "gbm", "online", "tpe"}
    assert len(spaces) == 3 and set(rows["problem"]) == set(spaces)
    for row in rows.to_dict("records"):
        space = spaces[str(row["problem"])]
        good = space.good(0.05)
        assert row["n_candidates"] == space.n and row["n_good"] == good.sum()
        assert row["random_expected"] == pytest.approx((space.n + 1) / (good.sum() + 1))
        curve = json.loads(str(row["best_so_far"]))
        assert len(curve) == row["evaluated"] and all(np.diff(curve) >= -1e-9)
        first = float(row["benchmarks_to_threshold"])
        if not np.isnan(first):
            # The curve crosses 1/1.05 exactly at the counted benchmark.
            b = int(first)
            assert curve[b - 1] >= 1 / 1.05 - 1e-3
            assert b == 1 or curve[b - 2] < 1 / 1.05 + 1e-3
        if row["order"] != "tpe":
            assert row["invalid_proposals"] == 0


def test_online_and_learned_beat_random_on_real_spaces(rows: pd.DataFrame) -> None:
    b = rows.assign(b=rows["benchmarks_to_threshold"].fillna(201))
    med = b.groupby(["problem", "order"])["b"].median().unstack()
    random_expected = b.groupby("problem")["random_expected"].first()
    # Every ordering but random uses what is known about speed; none is worse than random's
    # exact expectation by more than a few benchmarks on these spaces.
    assert (med["online"] <= random_expected + 2).all(), med
    kt = next(p for p in med.index if "2080" in p)
    assert med.loc[kt, "online"] < random_expected[kt] / 3


def test_report_files(rows: pd.DataFrame, tmp_path: Path) -> None:
    report = write_report(rows, tmp_path, 0.05, "test", 200, "dispatchtune evaluate ...")
    text = report.read_text()
    assert "| order |" in text and "best_so_far.png" in text
    results = pd.read_csv(tmp_path / "results.csv")
    assert {"problem", "order", "n_candidates", "benchmarks_to_threshold",
            "random_expected"} <= set(results.columns)
    assert len(results) == rows.groupby(["problem", "order"]).ngroups
    assert (tmp_path / "best_so_far.png").stat().st_size > 10_000


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["evaluate", "--dataset", str(DATASETS[1]), "--orders", "bogus",
                     "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown order" in err[0]
    with pytest.raises(InputError):
        load_replay_spaces([tmp_path / "missing.jsonl"])


def test_a_space_without_features_is_ordered_by_the_knob_heuristic() -> None:
    # The convolution has no feature mapping: the heuristic (and the online prior) fall back to
    # the raw knobs, power-of-two sizes first, instead of skipping the space.
    (space,) = load_replay_spaces([FIXTURES / "kt_conv_a4000_slice.json.gz"])
    assert space.features is None
    rows = replay_spaces([space], ["heuristic", "online"], range(2), max_benchmarks=space.n,
                         progress=False)
    assert set(rows["order"]) == {"heuristic", "online"}
    heuristic = rows[rows["order"] == "heuristic"]
    assert heuristic["evaluated"].eq(space.n).all()
    sizes = space.knobs[["block_size_x", "block_size_y", "tile_size_x", "tile_size_y"]].to_numpy()
    all_pow2 = ((sizes & (sizes - 1)) == 0).all(axis=1)
    order = KnobHeuristicModel().rank(space.knobs)
    # Every candidate whose four sizes are powers of two comes before any other; the flags
    # (read_only, use_shmem, ...) and the constant filter sizes carry no opinion.
    assert 0 < all_pow2.sum() < space.n and all_pow2[order[: all_pow2.sum()]].all()
    assert size_knobs(space.knobs) == ["block_size_x", "block_size_y", "tile_size_x", "tile_size_y"]


def test_a_model_learnt_on_another_architecture_is_an_opinion_not_the_lead(
        caplog: pytest.LogCaptureFixture) -> None:
    # The MI50 (AMD, 64-wide wavefronts) convolution learns from the A4000's (NVIDIA, 32-wide
    # warps): the transferred forest exists but the knob heuristic leads, the forest one opinion.
    spaces = load_replay_spaces([FIXTURES / "kt_conv_a4000_slice.json.gz",
                                 FIXTURES / "kt_conv_mi50_slice.json.gz"])
    models = _Models(spaces, "problem")
    a4000, mi50 = spaces
    assert [s.device for s in models.sources("transfer", mi50)] == [a4000.device]
    assert not models.learnt_here("transfer", mi50)
    with caplog.at_level("INFO", logger="dispatchtune.evaluation.harness"):
        main, others = _online_priors(mi50, models)
    assert "transfer learnt on other architectures only" in caplog.text
    np.testing.assert_allclose(main, KnobHeuristicModel().predict(mi50.knobs))
    transferred = models.transfer(mi50)
    assert transferred is not None and set(others) == {"transfer"}
    np.testing.assert_allclose(others["transfer"], transferred)


def test_the_workload_split_leaves_the_same_workload_on_other_devices_out() -> None:
    """`--split workload`: a space's learned models train neither on it nor on its workload
    measured on another device (two GPUs' pnpoly; a log's workload is its problem key, the same
    on every CPU); `problem` and `device` keep another device's copy; an unknown split is one
    error."""
    pnpoly = load_replay_spaces([FIXTURES / "kt_pnpoly_titan_slice.json.gz",
                                 FIXTURES / "kt_pnpoly_2080ti_slice.json.gz",
                                 FIXTURES / "kt_conv_a4000_slice.json.gz"])
    titan, ti, conv = pnpoly
    assert titan.workload == ti.workload != conv.workload and titan.device not in titan.workload
    key = json.loads((FIXTURES / "cpu_results_matmul_256x384x256.jsonl").read_text()
                     .splitlines()[0])["problem_key"]
    (log,) = load_replay_spaces([FIXTURES / "cpu_results_matmul_256x384x256.jsonl"])
    assert log.workload == key
    spaces = [titan, ti, conv]
    assert _Models(spaces, "problem").sources("transfer", titan) == [ti]
    assert _Models(spaces, "device").sources("transfer", titan) == [ti]
    assert _Models(spaces, "workload").sources("transfer", titan) == []
    with pytest.raises(InputError, match="unknown split 'shape'"):
        replay_spaces(spaces, ["knobs"], range(1), split="shape", progress=False)


@pytest.mark.parametrize(("a", "b", "same"), [
    ("NVIDIA RTX A4000", "NVIDIA RTX A6000", True),  # both Ampere
    ("NVIDIA A100-SXM4-80GB", "NVIDIA RTX A4000", True),
    ("NVIDIA RTX A4000", "NVIDIA GeForce RTX 2080 Ti", False),  # Ampere, Turing
    ("NVIDIA RTX A4000", "AMD Instinct MI50/MI60", False),
    ("AMD Instinct MI50/MI60", "AMD Instinct MI250X", False),  # GCN5, CDNA2
    ("AMD Instinct MI210", "AMD Instinct MI250X", True),
    ("AMD Radeon PRO W6600", "AMD Instinct MI250X", False),
    ("AMD Radeon Pro VII", "AMD Instinct MI300X", True),  # one generation unknown, wave64 both
    ("NVIDIA Jetson Orin", "NVIDIA RTX A4000", True),  # neither generation nor facts known
    ("my lab GPU", "my lab GPU", True),
    ("my lab GPU", "NVIDIA RTX A4000", False),
    ("", "NVIDIA RTX A4000", False),
    ("", "", False),  # two caches without a device name may come from any two GPUs
])
def test_same_architecture_is_vendor_and_generation(a: str, b: str, same: bool) -> None:
    assert same_architecture(a, b) is same


def test_same_vendor_with_another_subgroup_width_is_another_architecture() -> None:
    # Facts a user gave for an RDNA card (32-wide waves) set it apart from a 64-wide CDNA one.
    from dispatchtune.features.extract import TargetScalars
    from dispatchtune.features.kerneltuner import USER_DEVICES, register_device

    register_device("rx 7900", TargetScalars(is_gpu=True, compute_units=96, subgroup_size=32))
    try:
        assert not same_architecture("AMD Radeon RX 7900 XTX", "AMD Instinct MI50/MI60")
        assert same_architecture("AMD Radeon RX 7900 XTX", "AMD Radeon RX 7900 XT")
    finally:
        USER_DEVICES.pop("rx 7900")


def test_online_priors_transfer_from_the_same_kernel_on_other_devices() -> None:
    # Two devices' pnpoly spaces: each is scored by a forest over the other's knobs (leave one
    # space out); a space of another kernel learns nothing from them.
    pnpoly = [FIXTURES / "kt_pnpoly_titan_slice.json.gz", FIXTURES / "kt_pnpoly_2080ti_slice.json.gz"]
    spaces = load_replay_spaces([*pnpoly, FIXTURES / "kt_conv_a4000_slice.json.gz"])
    models = _Models(spaces, "problem")
    titan, ti, conv = spaces
    scores = models.transfer(titan)
    assert scores is not None and scores.shape == (titan.n,)
    assert models.transfer(conv) is None
    # The two devices agree on this kernel: the transferred order is better than a random one.
    assert _spearman(scores, -titan.times) > 0.3
    main, others = _online_priors(titan, models)
    np.testing.assert_allclose(main, scores)
    assert others == {}
    rows = replay_spaces(spaces, ["knobs", "online"], range(2), progress=False, only=[ti.problem])
    assert set(rows["problem"]) == {ti.problem} and set(rows["order"]) == {"knobs", "online"}


def test_hit_columns_stay_within_the_benchmark_cap() -> None:
    """hit@B is the share of runs within B benchmarks: a replay capped below B cannot report it
    (hit@200 of a 5-benchmark replay was hit@5 under another name)."""
    assert hit_budgets(1000) == hit_budgets(200) == (10, 50, 200)
    assert hit_budgets(100) == (10, 50, 100) and hit_budgets(50) == (10, 50)
    assert hit_budgets(5) == (5,)


def test_evaluate_cli_caps_hit_columns_and_prints_lines_when_stderr_is_not_a_terminal(
    tmp_path: Path,
) -> None:
    """As `tune`: a progress bar only on a terminal, else one line per step (tqdm's carriage
    returns made a log file one unreadable line)."""
    import subprocess
    import sys

    out = tmp_path / "eval"
    proc = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "evaluate", "--dataset", str(DATASETS[1]),
         "--orders", "random,heuristic", "--seeds", "1", "--max-benchmarks", "5", "-o", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    header = proc.stdout.splitlines()[0].split()
    assert header[-1] == "hit@5" and not any(c in header for c in ("hit@10", "hit@200"))
    report = (out / "report.md").read_text()
    assert "hit@5" in report and "hit@10" not in report and "hit@200" not in report
    assert "\r" not in proc.stderr and "it/s" not in proc.stderr
    assert "[1/2] replaying random on " in proc.stderr
    quiet = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "evaluate", "--dataset", str(DATASETS[1]),
         "--orders", "random", "--seeds", "1", "--no-progress", "-o", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert quiet.returncode == 0 and quiet.stderr.splitlines() == [f"report: {out / 'report.md'}"]
