"""`train-costmodel` end to end on real measured spaces, and its evaluation helpers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dispatchtune.cli import train_costmodel_main
from dispatchtune.costmodel.modelfile import load_model
from dispatchtune.costmodel.train import (
    evaluate_scores,
    pairwise_accuracy,
    problem_folds,
    report_paths,
)

FIXTURES = Path(__file__).parent / "fixtures"
KT = FIXTURES / "kt_gemm_2080ti_slice.json.gz"
CPU_MATMUL = FIXTURES / "cpu_results_matmul_256x384x256.jsonl"
CPU_CONV = FIXTURES / "cpu_results_conv_2x14x14x128.jsonl"


def test_train_gbm_cross_validates_and_saves_model_report_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "gbm.json"
    rc = train_costmodel_main([str(KT), str(CPU_MATMUL), str(CPU_CONV), "--model", "gbm",
                               "--output", str(output)])
    assert rc == 0
    report, plot = report_paths(output)
    assert report == tmp_path / "gbm.report.md" and plot.stat().st_size > 1000
    text = report.read_text()
    assert text in capsys.readouterr().out
    assert "leave one problem out" in text and "benchmarks to 5%, median" in text
    for name in ("GEMM 4096x4096x4096", "contraction m=256 n=384 k=256", "convolution batch=2"):
        assert name in text
    model = load_model(output)
    cv = model.metadata["cross_validation"]
    assert cv["held_out_problems"] == 3 and len(cv["per_problem"]) == 3
    for row in cv["per_problem"]:
        # Every figure is an exact expectation between 1 and N.
        assert 1.0 <= row["model"] <= row["n"] and 1.0 <= row["heuristic"] <= row["n"]
        assert row["random"] == pytest.approx((row["n"] + 1) / (row["k"] + 1))
        assert 0.0 <= row["pairwise"] <= 1.0 and 0.0 < row["top1"] <= row["top5"] <= 1.0
    assert model.metadata["training_data"]["rows"] == 430
    assert model.metadata["training_seconds"] > 0


@pytest.mark.parametrize("kind", ["rf", "lambdarank"])
def test_other_models_train_from_a_directory_of_tune_outputs(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "collected"
    for fixture in (CPU_MATMUL, CPU_CONV):
        (root / fixture.stem).mkdir(parents=True)
        shutil.copy(fixture, root / fixture.stem / "results.jsonl")
    output = tmp_path / f"{kind}.json"
    rc = train_costmodel_main([str(root), "--model", kind, "-o", str(output), "--no-plot",
                               "--time", "median"])
    assert rc == 0
    document = json.loads(output.read_text())
    assert document["model_type"] == kind
    assert document["metadata"]["cross_validation"]["held_out_problems"] == 2
    assert "Feature importances" in capsys.readouterr().out


def test_one_problem_trains_without_cross_validation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "one.json"
    assert train_costmodel_main([str(CPU_MATMUL), "-o", str(output), "--no-plot"]) == 0
    captured = capsys.readouterr()
    assert "cross-validation needs at least 2" in captured.err
    assert load_model(output).metadata["cross_validation"]["scheme"] == "none"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.jsonl"], "no such file"),
        ([str(FIXTURES / "malformed.mlir")], "expected a results.jsonl(.gz) log"),
        ([str(FIXTURES / "kt_conv_a4000_slice.json.gz")], "no measured problem"),
        (["BAD_GZ"], "not a readable gzip log"),
        (["shipped:nope"], "no shipped dataset 'nope'"),
    ],
)
def test_bad_inputs_exit_2_with_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if argv == ["BAD_GZ"]:  # a truncated or foreign file named like a compressed log
        argv = [str(tmp_path / "results.jsonl.gz")]
        Path(argv[0]).write_text("not gzip\n")
    rc = train_costmodel_main([*argv, "-o", str(tmp_path / "m.json")])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "m.json").exists()


def test_metrics_helpers() -> None:
    times = np.array([1.0, 2.0, 3.0, 4.0, 1.02])
    perfect = -times
    assert pairwise_accuracy(perfect, times) == 1.0
    assert pairwise_accuracy(times, times) == 0.0
    assert pairwise_accuracy(np.zeros(5), times) == 0.5
    good = evaluate_scores(perfect, times)
    assert good["benchmarks"] == 1.0 and good["top1"] == 1.0
    bad = evaluate_scores(times, times)
    assert bad["benchmarks"] == 4.0 and bad["top1"] == 0.25 and bad["top5"] == 1.0
    folds = problem_folds(["a", "b", "c", "d", "e"], 2, seed=0)
    assert len(folds) == 2
    assert sorted(p for fold in folds for p in fold) == ["a", "b", "c", "d", "e"]
    assert problem_folds(["a", "b"], 0, seed=0) == [["a"], ["b"]]


def test_cross_validation_holds_a_workload_out_on_every_device_it_was_measured_on(
        tmp_path: Path) -> None:
    """One matmul logged on two CPUs is two problems but one workload: a fit that scores it on
    one CPU never trains on it measured on the other; `--folds` deals workloads, not problems."""
    from dispatchtune.costmodel.train import cross_validate, load_training_data

    lines = CPU_MATMUL.read_text().splitlines()
    logs = []
    for cpu in ("x86-64-v3", "x86-64-v4"):
        logs.append(tmp_path / f"{cpu}.jsonl")
        logs[-1].write_text("".join(json.dumps({**json.loads(line), "target_cpu": cpu}) + "\n"
                                    for line in lines))
    data = load_training_data([*logs, CPU_CONV])
    matmuls = [p for p in data.problems if "256x384x256" in p]
    conv = [p for p in data.problems if p not in matmuls]
    assert len(matmuls) == 2 and len(conv) == 1
    assert data.workloads[matmuls[0]] == data.workloads[matmuls[1]]
    assert sorted(map(sorted, data.held_out_sets(0, seed=0))) == sorted([sorted(matmuls), conv])
    assert sorted(map(len, data.held_out_sets(2, seed=0))) == [1, 2]
    cv = cross_validate(data, "gbm")
    assert sorted(cv["problem"]) == sorted(data.problems)  # every problem scored once


def test_a_log_is_featurised_for_the_cpu_it_was_measured_on(tmp_path: Path) -> None:
    from dispatchtune.datasets.spaces import load_spaces
    from dispatchtune.features.spaces import space_features
    from dispatchtune.targets import get_target, record_target

    assert record_target("host", "") is get_target("host")
    assert record_target("host", get_target("host").cpu_facts().cpu) is get_target("host")
    assert record_target("host", "x86-64-v4").name == "llvm-cpu:x86-64-v4"
    assert record_target("gfx942", "x86-64-v4").name == "gfx942"
    lines = CPU_MATMUL.read_text().splitlines()
    fraction = {}
    for cpu in ("x86-64-v3", "x86-64-v4"):
        log = tmp_path / f"{cpu}.jsonl"
        log.write_text("".join(json.dumps({**json.loads(line), "target_cpu": cpu}) + "\n"
                               for line in lines))
        (space,) = load_spaces([log])
        label, features, times = space.label, space_features(space), space.times
        assert label.startswith(f"llvm-cpu:{cpu} ") or get_target("host").cpu_facts().cpu == cpu
        assert len(features) == len(times) > 10
        fraction[cpu] = features["cpu_register_tile_fraction"].to_numpy()
    # The accumulator tile over the register file (R * W bytes): AVX-512 has 32 registers of 64
    # bytes, AVX2 16 of 32, so the same logged tiles fill a quarter as much of it.
    np.testing.assert_allclose(fraction["x86-64-v4"] * 4, fraction["x86-64-v3"])
