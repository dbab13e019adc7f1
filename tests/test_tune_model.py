"""`tune-model` on the shipped transformer block: real compiles, profiles, benchmarks, resume."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatchtune.cli import main as cli_main
from dispatchtune.datasets.records import read_records
from dispatchtune.ir.frontend import load_problems
from dispatchtune.ir.spec import applied_configs, check_spec, config_applied
from dispatchtune.measure.builder import compile_module
from dispatchtune.measure.runner import Artifact, DispatchRow, LocalRunner
from dispatchtune.measure.verify import compare
from dispatchtune.problem import Problem
from dispatchtune.targets import get_target
from dispatchtune.tuner.loop import TuneOptions
from dispatchtune.tuner.model import (
    DispatchShare,
    ModelTuneOptions,
    ModelTuneResult,
    _ModelTuner,
    allocate_budget,
    attribute_time,
    find_entry,
    model_call,
    select_dispatches,
    tune_model,
)
from dispatchtune.tuner.model.decide import judge, rounds_to_reach, sign_test_p

MODEL = Path(__file__).resolve().parents[1] / "examples" / "models" / "transformer_block_f32.mlir"
HOST = get_target("host")


def small(**overrides: Any) -> ModelTuneOptions:
    """A whole run in a few minutes: 2 problems, 2 benchmarks each, short model rounds."""
    settings: dict[str, Any] = {
        "budget": 4, "max_dispatches": 2, "top": 2, "model_rounds": 2, "model_rounds_max": 5,
        "final_rounds": 3,
        "repetitions": 3, "min_time_s": 0.02, "progress": False,
        "dispatch": TuneOptions(repetitions=3, min_time_s=0.01, confirm_rounds=1, progress=False),
    }
    settings.update(overrides)
    return ModelTuneOptions(**settings)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ModelTuneResult]:
    out = tmp_path_factory.mktemp("tune_model") / "out"
    return out, tune_model(MODEL, HOST, out, small())


def _log(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "model_log.jsonl").read_text().splitlines()]


def test_profile_attributes_the_model_time_to_its_matmuls(run: tuple[Path, ModelTuneResult]) -> None:
    out, result = run
    profile = [r for r in _log(out) if r["kind"] == "profile"]
    assert len(profile) == 1 and profile[0]["timer"] == "cpu"
    rows = profile[0]["dispatches"]
    assert len(rows) >= 8 and all(r["time_ms"] > 0 and r["calls"] >= 1 for r in rows)
    # Matmuls dominate the block; the three 128x256x256 projections (one per dispatch, one of
    # them called twice) share one problem key, so one spec entry covers them all.
    shares = result.shares
    assert [s.time_ms for s in shares] == sorted((s.time_ms for s in shares), reverse=True)
    keys = {s.key: s for s in shares}
    proj = next(s for k, s in keys.items() if k.startswith("contraction_128x256x256_"))
    assert len(proj.dispatches) >= 2 and proj.calls >= 3
    assert {k.split("_")[1] for k in keys} >= {"128x1024x256", "128x256x1024", "128x256x256"}
    assert sum(s.share for s in shares) + result.other_ms / sum(r["time_ms"] for r in rows) == (
        pytest.approx(1.0)
    )
    # The two slowest problems were tuned, the budget shared between them.
    tuned = [s for s in shares if s.budget]
    assert [s.key for s in tuned] == [s.key for s in shares[:2]]
    assert sum(s.budget for s in tuned) == 4


def test_dispatch_results_use_the_loop_format(run: tuple[Path, ModelTuneResult]) -> None:
    out, result = run
    records = list(read_records(out / "dispatches" / "results.jsonl"))
    tuned = {s.key: s.budget for s in result.shares if s.budget}
    assert {r["problem_key"] for r in records} == set(tuned)
    for key, budget in tuned.items():
        benched = [r for r in records if r["problem_key"] == key and r["kind"] == "candidate"
                   and r["bench_status"] != "skipped"]
        assert len(benched) == budget
        assert all(r["target"] == "host" and r["times_ms"] for r in benched)
    assert (out / "dispatches" / "summary.md").exists()


def test_spec_summary_and_outputs(run: tuple[Path, ModelTuneResult], tmp_path: Path) -> None:
    out, result = run
    spec = out / "tuning_spec.mlir"
    check_spec(spec.read_text())
    # Every kept configuration really applies when the model is compiled with the spec, and the
    # tuned model computes what the default build computes.
    steps = [r for r in _log(out) if r["kind"] == "step"]
    assert {s["key"] for s in steps} <= {s.key for s in result.shares if s.budget}
    configs = {(s["key"], s["kept"]) for s in steps if s["kept"] is not None}
    assert set(result.kept.items()) == configs
    if result.kept:
        applied = applied_configs(MODEL, HOST, spec)
        records = list(read_records(out / "dispatches" / "results.jsonl"))
        for key, cid in result.kept.items():
            info = next(r["compilation_info"] for r in records
                        if r["problem_key"] == key and r["candidate_id"] == cid)
            assert any(config_applied(info, a) for a in applied)
    entry = find_entry(MODEL)
    call = model_call(entry, tmp_path / "inputs", seed=3)
    outputs = []
    for name, with_spec in (("default", None), ("tuned", spec)):
        vmfb = tmp_path / name / "model.vmfb"
        assert compile_module(MODEL, HOST, with_spec, vmfb, 600).ok
        got = LocalRunner().run(Artifact(vmfb, "local-sync"), call, 120).outputs
        assert got is not None and got[0].shape == (128, 256) and np.isfinite(got[0]).all()
        outputs.append(got)
    assert compare(outputs[1], outputs[0], [t.element_type for t in entry.results])[0] == "ok"
    assert result.verify_status == "ok"

    assert len(result.default_ms) == len(result.tuned_ms) == 3
    assert result.speedup_low <= result.speedup <= result.speedup_high
    summary = (out / "summary.md").read_text()
    assert "compiler default" in summary and "Speedup" in summary
    wins = sum(d > t for d, t in zip(result.default_ms, result.tuned_ms, strict=True))
    assert result.tuned_faster == wins and f"tuned faster in {wins} of 3 rounds" in summary
    assert "--iree-codegen-tuning-spec-path=" in summary
    for share in result.shares[:2]:
        assert f"`{share.key}`" in summary and f"{share.share:.1%}" in summary
    assert (out / "model_tuning.png").stat().st_size > 5000
    assert "speedup" in result.text


def test_rerun_resumes_without_measuring_anything(run: tuple[Path, ModelTuneResult]) -> None:
    out, first = run
    before = {p: (out / p).read_bytes() for p in ("model_log.jsonl", "dispatches/results.jsonl")}
    again = tune_model(MODEL, HOST, out, small())
    for path, content in before.items():
        assert (out / path).read_bytes() == content, f"{path} changed: something was re-measured"
    assert again.speedup == first.speedup and again.kept == first.kept
    assert again.default_ms == first.default_ms


def test_rerun_redoes_a_dispatch_confirmation_left_incomplete(
    run: tuple[Path, ModelTuneResult], tmp_path: Path
) -> None:
    """Killed after a dispatch's confirmation was planned but before it was measured (the log a
    kill leaves there: each record is appended at once), the rerun hands the dispatch back to the
    loop, which redoes the confirmation; screening is not re-measured."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(run[0], out)
    results = out / "dispatches" / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    plans = [i for i, r in enumerate(rows) if r["kind"] == "confirm" and r["confirm_round"] < 0
             and r["bench_status"] == "skipped" and r["confirm_finalists"] > 0]
    assert plans, "the first run logged no confirmation plan"
    key = rows[plans[0]]["problem_key"]
    # Everything of that dispatch after its plan is gone, as if killed right after the plan.
    kept = [r for i, r in enumerate(rows) if i <= plans[0] or r["problem_key"] != key]
    results.write_text("".join(json.dumps(r) + "\n" for r in kept))
    screened = [r for r in kept if r["problem_key"] == key and r["kind"] == "candidate"]
    # The rerun confirms every finalist, not only those that screened within the threshold's
    # margin of the default: on a loaded machine none may have, and the redone confirmation
    # would then rightly measure nothing, leaving this test nothing to check.
    options = small()
    tune_model(MODEL, HOST, out, replace(options, dispatch=replace(options.dispatch, min_speedup=1.0)))
    after = [json.loads(line) for line in results.read_text().splitlines()]
    redone = [r for r in after[len(kept):] if r["problem_key"] == key]
    assert any(r["kind"] == "confirm" and r["confirm_round"] >= 0 for r in redone)
    assert not any(r["kind"] == "candidate" for r in redone)  # screening kept, not re-measured
    assert [r for r in after if r["problem_key"] == key and r["kind"] == "candidate"] == screened


def test_model_step_builds_checks_and_measures_candidates(tmp_path: Path) -> None:
    """One greedy step with real configs: the model decides, and the decision is logged once."""
    problem = next(p for p in load_problems(MODEL, HOST) if p.key.startswith("contraction_128x1024"))
    good = (
        "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
        "distribution = [64, 64, 0], vector_common_parallel = [16, 16, 0], "
        "vector_reduction = [0, 0, 1]>, translation_info = #iree_codegen.translation_info<"
        "pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>"
    )
    broken = good.replace("[16, 16, 0]", "[64, 64, 0]").replace("[0, 0, 1]", "[0, 0, 64]")
    finalists: list[dict[str, Any]] = [
        {"candidate_id": 7, "dispatch_speedup": 1.2, "confirmed": True, "compilation_info": good},
        {"candidate_id": 8, "dispatch_speedup": 1.1, "confirmed": False, "compilation_info": broken},
    ]
    options = small(min_model_speedup=0.0)
    tuner = _ModelTuner(MODEL, HOST, tmp_path, options)
    tuner.problems = {problem.key: problem}
    for f in finalists:
        tuner.candidate_info[(problem.key, f["candidate_id"])] = f["compilation_info"]
    share = DispatchShare(problem, ["main_dispatch_14"], 1, 1.0, 0.4, "main_dispatch_14")
    step = tuner.model_step(share, finalists, [])
    by_id = {t["candidate_id"]: t for t in step.tried}
    assert by_id[8]["status"] == "build_failed" and "large vector sizes" in by_id[8]["error"]
    measured = by_id[7]
    assert measured["status"] == "measured" and measured["verify_status"] == "ok"
    # 2 rounds, then more only while the sign test is undecided (never past 5 here).
    assert 2 <= len(measured["ratios"]) <= 5 and measured["model_speedup"] > 0
    assert len(measured["ratios"]) == measured["rounds"]
    verdict = judge(measured["ratios"], 0.0, options.keep_alpha)
    assert verdict.decision != "undecided" or verdict.rounds == 5
    assert (step.kept == 7) == (verdict.decision == "keep")
    # The same step again comes from the log: nothing is built or measured twice.
    lines = (tmp_path / "model_log.jsonl").read_text()
    again = tuner.model_step(share, finalists, [])
    assert again.kept == step.kept and (tmp_path / "model_log.jsonl").read_text() == lines
    tuner.cleanup()


def test_budget_follows_time_and_selection_covers_the_model() -> None:
    assert allocate_budget([3.0, 2.0, 1.0], 12, 2) == [6, 4, 2]
    assert sum(allocate_budget([5.0, 1.0, 1.0], 10, 2)) == 10
    assert allocate_budget([5.0, 1.0, 1.0], 10, 2)[0] == 6
    # Too small a budget for everyone: the lightest problems get nothing.
    assert allocate_budget([3.0, 2.0, 1.0], 4, 2) == [2, 2, 0]
    assert allocate_budget([3.0, 2.0], 1, 2) == [1, 0]
    problem = Problem.matmul(64, 64, 64, "f32")
    shares = [DispatchShare(problem, [], 1, t, t / 10, "") for t in (5.0, 3.0, 1.5, 0.3, 0.2)]
    assert len(select_dispatches(shares, 0.75, 6, 0.02)) == 2
    assert len(select_dispatches(shares, 0.9, 6, 0.02)) == 3
    assert len(select_dispatches(shares, 1.0, 6, 0.025)) == 4  # 0.2 ms is 2% of 10 ms
    assert len(select_dispatches(shares, 1.0, 2, 0.0)) == 2


def test_time_is_grouped_by_problem_and_the_rest_is_other() -> None:
    a = replace(Problem.matmul(128, 256, 256, "f32"), name="main_dispatch_2_matmul")
    b = replace(a, name="main_dispatch_3_matmul")
    c = replace(Problem.matmul(128, 1024, 256, "f32"), name="main_dispatch_14_matmul")
    rows = [DispatchRow("main_dispatch_2_matmul_x", 1.0, 2), DispatchRow("main_dispatch_3_m", 0.5, 1),
            DispatchRow("main_dispatch_14_matmul", 2.0, 1), DispatchRow("main_dispatch_5_t", 0.5, 2)]
    shares, other, total = attribute_time(rows, [a, b, c])
    assert total == 4.0 and other == 0.5
    assert [(s.time_ms, s.calls) for s in shares] == [(2.0, 1), (1.5, 3)]
    assert shares[1].slowest == "main_dispatch_2_matmul_x" and shares[1].share == 0.375


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        (None, [], "no such file"),
        ("func.func @main( {", [], "malformed MLIR"),
        ("func.func @main(%a: tensor<?x4xf32>) -> tensor<?x4xf32> {\n  return %a : tensor<?x4xf32>\n}",
         [], "dynamic shape"),
        ("func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}",
         ["--function", "g"], "no public function @g"),
        ("func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}",
         ["--budget", "0"], "--budget must be at least 1"),
        ("func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}",
         ["--target", "nope"], "unknown target"),
    ],
)
def test_cli_reports_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, args: list[str],
    message: str,
) -> None:
    path = tmp_path / "model.mlir"
    if text is not None:
        path.write_text(text)
    code = cli_main(["tune-model", str(path), "-o", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err


def test_cli_model_without_tunable_dispatch_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "relu.mlir"
    path.write_text(
        "func.func @main(%a: tensor<64x64xf32>) -> tensor<64x64xf32> {\n"
        "  %z = arith.constant 0.0 : f32\n"
        "  %e = tensor.empty() : tensor<64x64xf32>\n"
        "  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, "
        "affine_map<(i, j) -> (i, j)>], iterator_types = [\"parallel\", \"parallel\"]}\n"
        "      ins(%a : tensor<64x64xf32>) outs(%e : tensor<64x64xf32>) {\n"
        "    ^bb0(%x: f32, %o: f32):\n"
        "      %m = arith.maximumf %x, %z : f32\n"
        "      linalg.yield %m : f32\n"
        "  } -> tensor<64x64xf32>\n"
        "  return %r : tensor<64x64xf32>\n"
        "}\n"
    )
    code = cli_main(["tune-model", str(path), "-o", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "tunable" in err, err


def test_output_dir_of_another_model_is_refused(
    run: tuple[Path, ModelTuneResult], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = run
    other = tmp_path / "other.mlir"
    other.write_text(MODEL.read_text() + "\n// changed\n")
    code = cli_main(["tune-model", str(other), "-o", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "another model" in err and len(err.splitlines()) == 1


def test_one_failing_dispatch_is_reported_and_the_others_are_tuned(tmp_path: Path) -> None:
    """A dispatch whose tuning fails becomes a skip reason (logged, reused on resume)."""
    model = Path(__file__).resolve().parent / "fixtures" / "mlp_two_matmuls.mlir"
    problems = load_problems(model, HOST)
    good = problems[0]
    broken = replace(problems[1], name="mlp_dispatch_99_matmul")  # no such dumped dispatch
    shares = [DispatchShare(broken, [broken.name], 1, 2.0, 0.5, broken.name, budget=2),
              DispatchShare(good, [good.name], 1, 1.0, 0.25, good.name, budget=2)]
    tuner = _ModelTuner(model, HOST, tmp_path, small())
    records = tuner.tune_dispatches(shares)
    assert shares[0].skip_reason.startswith("dispatch tuning failed: ")
    assert "no dumped benchmark" in shares[0].skip_reason and not shares[1].skip_reason
    assert {r.problem_key for r in records} == {good.key}
    failed = [r for r in _log(tmp_path) if r["kind"] == "dispatch_failed"]
    assert [r["key"] for r in failed] == [broken.key]
    again = [replace(s, skip_reason="") for s in shares]
    tuner.tune_dispatches(again)  # resumed: the failure comes from the log, nothing re-run
    assert again[0].skip_reason == shares[0].skip_reason
    assert len([r for r in _log(tmp_path) if r["kind"] == "dispatch_failed"]) == 1


def test_keep_rule_needs_a_significant_sign_test_and_a_minimum_effect() -> None:
    """The keep rule on paired rounds measured here (docs/model_tuning.md)."""
    assert sign_test_p(5, 5) == 1 / 32 and sign_test_p(0, 5) == 1.0
    assert rounds_to_reach(0.05) == 5 and rounds_to_reach(0.5) == 1
    # An A/A pair (the default binary on both sides, a final round of a run that kept nothing):
    # the old rule (median > 1.01, two thirds won) kept it; the sign test wants more rounds.
    aa = [1.087, 1.057, 0.993, 1.026, 1.05]
    assert judge(aa, 1.01, 0.05).decision == "undecided"
    # Winning every round of 5 with a 5% median gain is kept; the same with a 0.5% gain is not.
    assert judge([1.055, 1.116, 1.113, 1.048, 1.112], 1.01, 0.05).decision == "keep"
    assert judge([1.005, 1.004, 1.006, 1.003, 1.007], 1.01, 0.05).decision == "reject"
    # Losing half of the rounds, or a median at or below 1, ends the step: more rounds won't help.
    assert judge([1.2, 1.1, 0.9, 0.95], 1.01, 0.05).decision == "reject"
    assert judge([0.99, 1.0, 1.02, 0.98, 1.03], 1.01, 0.05).decision == "reject"
    # 12 of 15 rounds won is significant (p 0.018), 11 of 15 (p 0.059) is not.
    twelve = [1.03] * 12 + [0.99] * 3
    assert judge(twelve, 1.01, 0.05).decision == "keep"
    assert judge([1.03] * 11 + [0.99] * 4, 1.01, 0.05).decision == "undecided"


# A valid CPU configuration of the block's FFN-up matmul (contraction 128x1024x256).
FFN_UP_CONFIG = (
    "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
    "distribution = [64, 64, 0], vector_common_parallel = [16, 16, 0], "
    "vector_reduction = [0, 0, 1]>, translation_info = #iree_codegen.translation_info<"
    "pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>"
)


def _finished_run(out: Path, problem: Problem, config: str) -> None:
    """A tune-model output directory as a run leaves it: profile, final rounds, the spec."""
    from dispatchtune.ir.lowering import scan_input
    from dispatchtune.measure.builder import write_spec_file
    from dispatchtune.tuner.model.log import ModelLog

    log = ModelLog(out / "model_log.jsonl")
    log.append("profile", model=str(MODEL), source=str(MODEL), model_sha256=scan_input(MODEL)[0],
               target="host", device="local-sync", function="main", timer="cpu",
               compile_flags=list(HOST.compile_flags), dispatches=[])
    log.append("final", kept=[[problem.key, 7]], timer="cpu", rounds=3,
               default_times_ms=[[3.0, 3.1], [3.3], [2.9]], tuned_times_ms=[[2.5], [3.0], [3.0]])
    write_spec_file([(problem, config)], out / "tuning_spec.mlir")


def test_reproduce_model_measures_the_spec_separately(tmp_path: Path) -> None:
    """benchmarks/reproduce_model.py: the run's flags, with and without its spec, paired runs."""
    from dispatchtune.benchmarks.reproduce_model import reproduce

    problem = next(p for p in load_problems(MODEL, HOST) if p.key.startswith("contraction_128x1024"))
    out = tmp_path / "run"
    _finished_run(out, problem, FFN_UP_CONFIG)
    result = reproduce(MODEL, out, 2, repetitions=2, min_time_s=0.01, work=tmp_path)
    assert not result.identical_binaries  # the spec changed the FFN-up matmul
    assert len(result.default_ms) == len(result.tuned_ms) == len(result.ratios) == 2
    assert min(result.default_ms + result.tuned_ms) > 0 and 0 <= result.tuned_faster <= 2
    assert result.ratios == pytest.approx([d / t for d, t in zip(result.default_ms,
                                                                  result.tuned_ms, strict=True)])
    # Beside it, what the run reported: rounds 3.0/2.5, 3.3/3.0, 2.9/3.0.
    assert result.reported == pytest.approx(1.1) and result.reported_low == pytest.approx(2.9 / 3)
    assert "tuned faster in" in result.text and "tune-model reported: 1.100x" in result.text
    assert list(tmp_path.glob("reproduce-*")) == []  # builds are temporary


def test_reproduce_model_refuses_another_models_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dispatchtune.benchmarks.reproduce_model import main

    problem = next(p for p in load_problems(MODEL, HOST) if p.key.startswith("contraction_128x1024"))
    out = tmp_path / "run"
    out.mkdir()
    assert main([str(MODEL), str(out)]) == 2
    assert "holds no finished tune-model run" in capsys.readouterr().err
    _finished_run(out, problem, FFN_UP_CONFIG)
    other = Path(__file__).resolve().parent / "fixtures" / "mlp_two_matmuls.mlir"
    assert main([str(other), str(out), "--pairs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run of another model" in err
