"""The real tuning loop on the CPU: spec applied, results logged, failures kept, kill + resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dispatchtune.candidate import Candidate
from dispatchtune.cli import main as cli_main
from dispatchtune.datasets.records import CorruptRecordWarning, read_results
from dispatchtune.ir.spec import applied_configs, config_applied
from dispatchtune.targets import get_target
from dispatchtune.tuner.loop import TuneOptions, tune

FIXTURE = Path(__file__).parent / "fixtures" / "tuner_matmul_f32_128.mlir"
HOST = get_target("host")


def cpu_config(dist: tuple[int, int], vec: tuple[int, int], red: int) -> str:
    return (
        "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
        f"distribution = [{dist[0]}, {dist[1]}, 0], "
        f"vector_common_parallel = [{vec[0]}, {vec[1]}, 0],"
        f" vector_reduction = [0, 0, {red}]>, translation_info = #iree_codegen.translation_info<"
        "pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>"
    )


GPU_CONFIG = (
    "#iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{reduction = "
    "[0, 0, 8], thread = [1, 4, 0], workgroup = [32, 64, 0]}>, translation_info = "
    "#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> "
    "workgroup_size = [64, 1, 1] subgroup_size = 64>>"
)


def candidates() -> list[Candidate]:
    """Good configs with deliberately failing ones among them (ids as in an enumeration)."""
    configs = [
        ("bad: 64x64 vectors", cpu_config((64, 64), (64, 64), 64)),  # "large vector sizes"
        ("good", cpu_config((32, 64), (8, 16), 8)),
        ("gpu config on llvm-cpu", GPU_CONFIG),  # "failed to build pass pipeline"
        ("good", cpu_config((64, 64), (16, 16), 1)),
        ("good", cpu_config((32, 32), (8, 32), 4)),
        ("good", cpu_config((128, 128), (4, 32), 2)),
    ]
    return [
        Candidate(10 + i, info, "DoubleTilingExpert", {"label": label}, rank=i)
        for i, (label, info) in enumerate(configs)
    ]


def fast(**overrides: Any) -> TuneOptions:
    """Options for short test runs: 3 quick repetitions, 2 confirmation rounds, no progress."""
    settings: dict[str, Any] = {
        "repetitions": 3, "min_time_s": 0.01, "progress": False, "confirm_rounds": 2,
    }
    settings.update(overrides)
    return TuneOptions(**settings)


def test_loop_logs_every_outcome_and_writes_an_applied_spec(tmp_path: Path) -> None:
    out = tmp_path / "run"
    options = fast(budget=2, baseline_every=1, min_speedup=0.0)
    result = tune(FIXTURE, HOST, out, options, candidates=candidates())
    records = list(read_results(out / "results.jsonl"))
    by_id = {r.candidate_id: r for r in records if r.is_candidate}
    baselines = [r for r in records if r.is_baseline]

    # Start, after each benchmark (baseline_every=1) and at the end: drift is visible.
    assert len(baselines) >= 3
    assert all(len(b.times_ms) == 3 and b.candidate_id == -1 for b in baselines)
    assert baselines[0].compilation_info.startswith("#iree_codegen.compilation_info")
    # The CPU `host` stood for is logged, so the log is featurised for it on any machine.
    assert {r.target_cpu for r in records} == {HOST.cpu_facts().cpu}

    bad, gpu = by_id[10], by_id[12]
    assert bad.compile_status == "failed" and "large vector sizes" in bad.compile_error
    assert gpu.compile_status == "failed" and "pass pipeline" in gpu.compile_error
    assert bad.times_ms == [] and bad.bench_status == "skipped"

    benched = [r for r in by_id.values() if r.bench_status == "ok"]
    assert len(benched) == 2  # the budget counts benchmarks, not failures
    for record in benched:
        assert record.compile_status == "ok" and len(record.binary_sha256) == 64
        assert len(record.times_ms) == 3 and len(record.baseline_times_ms) == 3
        assert record.verify_status == "ok" and (record.max_abs_error or 0.0) < 1e-3
        assert record.iree_version and record.device == "local-sync"

    # The spec holds the best candidate, and IREE really applies it to the dispatch.
    best = result.summaries[0].best
    assert best is not None and best["candidate_id"] in {r.candidate_id for r in benched}
    assert result.spec_path is not None and result.spec_path.exists()
    applied = applied_configs(FIXTURE, HOST, result.spec_path)
    assert any(config_applied(best["compilation_info"], a) for a in applied)
    # The finalists were re-measured in rounds interleaved with the default, after the plan
    # record that lets a resumed run see a confirmation interrupted before its measurements.
    plan, *confirms = [r for r in records if r.is_confirm]
    assert plan.is_confirm_plan and not plan.times_ms and plan.confirm_rounds == 2
    assert len(confirms) == 2 * 2  # 2 finalists x 2 rounds
    assert all(len(r.baseline_times_ms) == 3 and r.bench_status == "ok" for r in confirms)
    assert result.summaries[0].confirm_rounds == 2
    summary = (out / "summary.md").read_text()
    assert "compile failed" in summary and "speedup" in summary
    assert (out / "progress.png").stat().st_size > 1000
    assert "best: candidate" in result.text


def test_duplicates_and_timeouts_are_recorded_not_benchmarked(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = cpu_config((32, 64), (8, 16), 8)
    # The same configuration spelled differently builds a byte-identical binary.
    cands = [Candidate(1, config), Candidate(2, config.replace(", ", ",  "))]
    options = fast(budget=2, verify=False, confirm_top=0)
    tune(FIXTURE, HOST, out, options, candidates=cands)
    records = {r.candidate_id: r for r in read_results(out / "results.jsonl")
               if r.is_candidate}
    statuses = sorted(r.compile_status for r in records.values())
    assert statuses == ["duplicate", "ok"]
    dup = next(r for r in records.values() if r.compile_status == "duplicate")
    assert dup.duplicate_of in (1, 2) and dup.times_ms == []

    timed = tmp_path / "timeout"
    result = tune(
        FIXTURE, HOST, timed, fast(budget=1, compile_timeout_s=0.05, verify=False, confirm_top=0),
        candidates=[Candidate(5, cpu_config((32, 32), (8, 32), 4))],
    )
    (record,) = [r for r in read_results(timed / "results.jsonl") if r.is_candidate]
    assert record.compile_status == "timeout" and "timed out" in record.compile_error
    # Nothing beat the default: the spec, if any, configures nothing, and the summary says so.
    assert "No candidate beat the compiler default" in (timed / "summary.md").read_text()
    assert result.summaries[0].best is None and "compile timeout 1" in result.text
    if result.spec_path is not None:
        assert "compilation_info" not in result.spec_path.read_text()

    # Compile-only (GPU targets without their GPU): built and checked, nothing run.
    built = tmp_path / "compile_only"
    result = tune(FIXTURE, HOST, built, fast(budget=1, compile_only=True),
                  candidates=[Candidate(6, cpu_config((32, 32), (8, 32), 4))])
    logged = list(read_results(built / "results.jsonl"))
    assert [(r.kind, r.compile_status, r.bench_status) for r in logged] == [
        ("candidate", "ok", "skipped")
    ]
    assert len(logged[0].binary_sha256) == 64
    assert "Compile-only run: 1 candidate(s) were built and checked" in result.text


_KILLABLE = """
import sys
sys.path.insert(0, {tests!r})
from test_tuner_loop import candidates, fast, FIXTURE, HOST
from dispatchtune.tuner.loop import tune
try:
    tune(FIXTURE, HOST, {out!r}, fast(budget=3, baseline_every=2, confirm_top=0),
         candidates=candidates())
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_kill_and_resume_loses_nothing_and_remeasures_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    results = out / "results.jsonl"
    script = _KILLABLE.format(tests=str(Path(__file__).parent), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and sum(
            '"kind": "candidate"' in line and '"bench_status": "ok"' in line
            for line in results.read_text().splitlines()
        ) >= 1:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    before = [json.loads(line) for line in results.read_text().splitlines()]
    measured_before = {r["candidate_id"]: r["timestamp"] for r in before
                       if r["kind"] == "candidate"}
    assert 1 <= len(measured_before) < len(candidates())

    with results.open("a") as handle:
        handle.write("{this line was corrupted\n")
    bad_line = len(before) + 1
    options = fast(budget=3, baseline_every=2, confirm_top=0)
    with pytest.warns(CorruptRecordWarning, match=rf"results\.jsonl:{bad_line}: corrupt record"):
        tune(FIXTURE, HOST, out, options, candidates=candidates())
    with pytest.warns(CorruptRecordWarning):
        after = [r for r in read_results(results) if r.is_candidate]
    ids = [r.candidate_id for r in after]
    assert len(ids) == len(set(ids)), "a candidate was tried twice"
    for cid, stamp in measured_before.items():  # kept as they were, not re-measured
        assert next(r.timestamp for r in after if r.candidate_id == cid) == stamp
    assert sum(r.bench_status == "ok" for r in after) == 3
    # Both failing configs come first or in between, so all six were tried exactly once.
    assert {r.candidate_id for r in after} <= {c.candidate_id for c in candidates()}
    assert {10, 12} <= set(ids)

    # A third run with the same budget has nothing left to do and measures nothing.
    size = results.stat().st_size
    with pytest.warns(CorruptRecordWarning):
        tune(FIXTURE, HOST, out, options, candidates=candidates())
    assert results.stat().st_size == size


def test_cli_reports_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(["tune", str(tmp_path / "missing.mlir"), "--output-dir", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dispatchtune: error:") and "\n" not in err
    code = cli_main(["tune", str(FIXTURE), "--output-dir", str(tmp_path), "--budget", "0"])
    assert code == 2 and "--budget" in capsys.readouterr().err


def test_cli_tunes_with_the_real_enumerator_and_ranker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli"
    code = cli_main([
        "tune", str(FIXTURE), "--target", "host", "--budget", "2", "--output-dir", str(out),
        "--order", "random", "--repetitions", "2", "--confirm-top", "0", "--no-progress",
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert "benchmarked 2" in printed and "speedup" in printed
    records = [r for r in read_results(out / "results.jsonl") if r.is_candidate]
    assert all(r.order == "random" for r in records)
    # Rows of the Z3 enumeration table, ordered by dispatchtune.rank, with their knobs and the
    # digest of that enumeration.
    assert all(r.candidate_id >= 0 and r.rank >= 0 and "tile_m" in r.knobs
               for r in records)
    (digest,) = {r.space_digest for r in records}
    assert len(digest) == 16
    assert (out / "summary.md").exists()


def test_a_wrong_output_is_recorded_as_a_miscompile_and_never_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real compile, benchmark and run; the candidate's output is then corrupted, as a
    miscompiling configuration would produce (no real CPU miscompile is known to reproduce)."""
    from dataclasses import replace

    from dispatchtune.measure.runner import Artifact, LocalRunner, RunOutcome

    real_run = LocalRunner.run

    def corrupting_run(self: LocalRunner, artifact: Artifact, *args: Any) -> RunOutcome:
        outcome = real_run(self, artifact, *args)
        if outcome.outputs is not None and "baseline" not in str(artifact.vmfb):
            output = outcome.outputs[0].copy()
            output[3, 5] += 1.0
            outcome = replace(outcome, outputs=[output])
        return outcome

    monkeypatch.setattr(LocalRunner, "run", corrupting_run)
    out = tmp_path / "run"
    options = fast(budget=1, confirm_top=0, min_speedup=0.0)
    candidate = Candidate(7, cpu_config((32, 64), (8, 16), 8))
    result = tune(FIXTURE, HOST, out, options, candidates=[candidate])
    (record,) = [r for r in read_results(out / "results.jsonl") if r.is_candidate]
    assert record.bench_status == "ok" and len(record.times_ms) == 3
    assert record.verify_status == "mismatch" and record.max_abs_error == pytest.approx(1.0)
    assert "miscompile" in record.verify_error
    assert result.summaries[0].miscompiles == [7] and result.summaries[0].best is None
    assert "MISCOMPILES" in result.text and "[7]" in (out / "summary.md").read_text()


def test_transient_failures_are_retried_bounded_and_a_larger_timeout_retries(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    candidate = [Candidate(5, cpu_config((32, 32), (8, 32), 4))]

    def attempts(timeout_s: float, **overrides: Any) -> list[tuple[str, bool, float | None]]:
        options = fast(budget=1, compile_timeout_s=timeout_s, verify=False, confirm_top=0,
                       **overrides)
        tune(FIXTURE, HOST, out, options, candidates=candidate)
        return [(r.compile_status, r.transient, r.compile_timeout_s)
                for r in read_results(out / "results.jsonl") if r.is_candidate]

    for _ in range(4):  # the fourth run has nothing left to try
        tried = attempts(0.05)
    assert tried == [("timeout", True, 0.05)] * 3
    # A larger compile timeout is a new chance; the report counts the latest attempt only.
    tried = attempts(120.0)
    assert tried[-1] == ("ok", False, 120.0) and len(tried) == 4
    assert "compile timeout" not in (out / "summary.md").read_text()


def test_retry_failed_tries_permanent_failures_again(tmp_path: Path) -> None:
    out = tmp_path / "run"
    broken = [Candidate(12, GPU_CONFIG)]  # fails to build on llvm-cpu, every time
    options = fast(budget=1, verify=False, confirm_top=0)
    tune(FIXTURE, HOST, out, options, candidates=broken)
    tune(FIXTURE, HOST, out, options, candidates=broken)
    logged = [r for r in read_results(out / "results.jsonl") if r.is_candidate]
    assert [(r.compile_status, r.transient) for r in logged] == [("failed", False)]
    tune(FIXTURE, HOST, out, fast(budget=1, verify=False, confirm_top=0, retry_failed=True),
         candidates=broken)
    assert sum(r.is_candidate for r in read_results(out / "results.jsonl")) == 2


def test_an_interrupted_confirmation_is_redone_on_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from dispatchtune.tuner.report import decided_records, latest_confirmation

    out = tmp_path / "run"
    results = out / "results.jsonl"
    options = fast(budget=2, verify=False, confirm_top=2, confirm_rounds=2, min_speedup=0.0)
    good = [c for c in candidates() if c.knobs["label"] == "good"][:2]
    tune(FIXTURE, HOST, out, options, candidates=good)
    lines = results.read_text().splitlines()
    # The measurements (the plan record, confirm_round -1, opens the confirmation).
    confirms = [i for i, line in enumerate(lines)
                if json.loads(line)["kind"] == "confirm" and json.loads(line)["confirm_round"] >= 0]
    assert len(confirms) == 4
    # Killed after the first finalist of the second round: the rest of the log never written.
    results.write_text("\n".join(lines[: confirms[2] + 1]) + "\n")
    records = list(read_results(results))
    key = records[0].problem_key
    partial, complete = latest_confirmation(records, key, HOST.name)
    assert len(partial) == 3 and not complete
    with caplog.at_level("WARNING"):
        decided = decided_records(records, [key], HOST.name, warn=True)
    assert not any(r.is_confirm for r in decided) and "confirmation was interrupted" in caplog.text

    result = tune(FIXTURE, HOST, out, options, candidates=good)
    records = list(read_results(results))
    latest, complete = latest_confirmation(records, key, HOST.name)
    assert complete and len(latest) == 4 and latest[0].session != partial[0].session
    assert sum(r.is_candidate for r in records) == 2  # nothing screened again
    assert result.summaries[0].confirm_rounds == 2


def test_a_confirmation_interrupted_before_its_first_measurement_is_redone(tmp_path: Path) -> None:
    """Ctrl-C as soon as the confirmation says it starts (before it has measured anything), then
    the same command again, as the README runs it: the rerun confirms, screening is kept."""
    from dispatchtune.tuner.report import latest_confirmation

    out = tmp_path / "run"
    results = out / "results.jsonl"
    # Enough rounds (~60 benchmark runs) that Ctrl-C lands inside the confirmation even on a
    # loaded CI machine: with 2 rounds, it once finished before the signal arrived.
    rounds = 20
    # --min-speedup below 1: every measured candidate is a finalist, however it screened.
    argv = [sys.executable, "-m", "dispatchtune", "tune", str(FIXTURE), "--target", "host",
            "--budget", "2", "-o", str(out), "--repetitions", "2", "--confirm-top", "2",
            "--confirm-rounds", str(rounds), "--min-speedup", "0.5", "--no-verify"]
    # Ctrl-C at its default in the child: a test run started by a script in the background (a
    # non-interactive shell's `&`) passes SIGINT on ignored, and Python keeps ignoring it.
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "confirming the 2 best candidate(s)" in line:
            os.kill(proc.pid, signal.SIGINT)
            break
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, "".join(seen) + rest
    before = list(read_results(results))
    key = before[0].problem_key
    partial, complete = latest_confirmation(before, key, HOST.name)
    assert not complete and len(partial) < 2 * rounds
    screened = {r.candidate_id: r.timestamp for r in before if r.is_candidate}
    assert len(screened) == 2

    again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "confirmation of" in again.stderr and "was interrupted: redoing it" in again.stderr
    assert f"confirmed in {rounds} round(s)" in again.stdout
    assert "single screening measurement" not in again.stdout
    after = list(read_results(results))
    latest, complete = latest_confirmation(after, key, HOST.name)
    assert complete and len(latest) == 2 * rounds
    assert {r.candidate_id for r in latest} == set(screened)
    # Nothing screened again: the same two candidate records, untouched.
    assert {r.candidate_id: r.timestamp for r in after if r.is_candidate} == screened


def test_the_confirmation_plan_is_logged_before_anything_is_measured() -> None:
    """The log states a confirmation's plan first: a log cut at any record of it (the plan alone
    included) reads as interrupted; a plan of 0 finalists closes one with nothing to measure."""
    from dispatchtune.datasets.records import RecordKind, ResultRecord
    from dispatchtune.tuner.report import decided_records, latest_confirmation

    def record(candidate_id: int = -1, **fields: Any) -> ResultRecord:
        return ResultRecord(problem={}, problem_key="k", target="host", device="local-sync",
                            candidate_id=candidate_id, kind=RecordKind.CONFIRM, session="s",
                            **fields)

    plan = record(confirm_rounds=2, confirm_finalists=2)
    # One of the two finalists built: 2 rounds x 1 finalist, under the plan they carry.
    measured = [record(3, confirm_round=r, confirm_rounds=2, confirm_finalists=1,
                       bench_status="ok", times_ms=[1.0]) for r in range(2)]
    assert plan.is_confirm_plan and not any(m.is_confirm_plan for m in measured)
    assert latest_confirmation([plan], "k", "host") == ([], False)
    assert latest_confirmation([plan, measured[0]], "k", "host") == ([measured[0]], False)
    assert latest_confirmation([plan, *measured], "k", "host") == (measured, True)
    closed = record(confirm_rounds=2, confirm_finalists=0)
    assert latest_confirmation([plan, closed], "k", "host") == ([], True)
    # A log written before plans were recorded: measurements without a plan count as complete.
    old = [record(3, bench_status="ok", times_ms=[1.0])]
    assert latest_confirmation(old, "k", "host") == (old, True)
    assert decided_records([plan, *measured], ["k"], "host") == measured


def test_screening_without_a_confirmation_after_it_is_pending() -> None:
    """Screening waits for a confirmation when none followed it: a run killed between its last
    screening measurement and the plan record, or one that screened more after a confirmation."""
    from dispatchtune.datasets.records import RecordKind, ResultRecord
    from dispatchtune.tuner.report import confirmation_pending

    def record(kind: RecordKind, candidate_id: int, **fields: Any) -> ResultRecord:
        return ResultRecord(problem={}, problem_key="k", target="host", device="local-sync",
                            candidate_id=candidate_id, kind=kind, session="s", **fields)

    screened = [record(RecordKind.CANDIDATE, i, bench_status="ok", times_ms=[1.0])
                for i in range(2)]
    failed = record(RecordKind.CANDIDATE, 5, compile_status="failed")
    plan = record(RecordKind.CONFIRM, -1, confirm_rounds=1, confirm_finalists=1)
    measured = record(RecordKind.CONFIRM, 0, confirm_round=0, confirm_rounds=1,
                      confirm_finalists=1, bench_status="ok", times_ms=[1.0])
    assert confirmation_pending(screened, "k", "host")
    assert confirmation_pending([*screened, plan], "k", "host")  # interrupted
    assert not confirmation_pending([*screened, plan, measured], "k", "host")
    assert not confirmation_pending([*screened, plan, measured, failed], "k", "host")
    assert confirmation_pending([*screened, plan, measured, screened[0]], "k", "host")
    assert not confirmation_pending([failed], "k", "host")  # nothing to confirm
    assert not confirmation_pending(screened, "other", "host")


def test_a_run_killed_before_its_confirmation_started_confirms_on_resume(tmp_path: Path) -> None:
    """The log a kill between the last screening measurement and the confirmation's plan leaves
    (a finished run's log cut after its last candidate record): the same command again confirms
    instead of writing the spec from one screening measurement."""
    out = tmp_path / "run"
    results = out / "results.jsonl"
    argv = [sys.executable, "-m", "dispatchtune", "tune", str(FIXTURE), "--target", "host",
            "--budget", "2", "-o", str(out), "--repetitions", "2", "--confirm-top", "2",
            "--confirm-rounds", "2", "--min-speedup", "0.5", "--no-verify"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    lines = results.read_text().splitlines(keepends=True)
    records = list(read_results(results))
    last_screened = max(i for i, r in enumerate(records) if r.is_candidate)
    assert any(r.is_confirm for r in records[last_screened:])
    results.write_text("".join(lines[: last_screened + 1]))

    again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "was interrupted: redoing it" in again.stderr
    assert "confirmed in 2 round(s)" in again.stdout
    # Why the outputs went unchecked is said where the verdict is, not only in the log.
    assert "outputs not checked: verification disabled" in again.stdout
    after = list(read_results(results))
    assert sum(r.is_candidate for r in after) == sum(r.is_candidate for r in records)


def test_cli_tunes_a_directory_of_dumped_dispatches(tmp_path: Path) -> None:
    """`tune DIR` on a model's dump (matmul, max pooling, elementwise add): the matmul is tuned,
    the pooling dispatch reported as not tuned, the elementwise one skipped in a summary line."""
    from cpu_checks import dump_dispatches

    dumps = tmp_path / "dumps"
    assert len(dump_dispatches(FIXTURE.parent / "matmul_pool_add_f32.mlir", dumps)) == 3
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune", str(dumps), "--target", "host", "--budget",
         "2", "-o", str(out), "--repetitions", "2", "--confirm-top", "1", "--confirm-rounds", "1"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{dumps}: skipped 1 of 3 dispatch(es) without a tunable root op" in proc.stderr
    assert ("not tuned: dispatchtune tunes contractions, convolutions and attention, not pooling"
            in proc.stdout)
    # The reason is the pooling's whole story: nothing was tried, so nothing "failed to measure".
    assert "no candidate was measured successfully" not in proc.stdout
    tried = [r for r in read_results(out / "results.jsonl") if r.is_candidate]
    assert {r.problem_key[:25] for r in tried} == {"contraction_64x64x128_f32"}
    # A build identical to the default is not measured and not counted against the budget (on
    # AVX2 hosts the heuristic's first pick is IREE's own choice for this matmul).
    measured = [r for r in tried if r.compile_status != "duplicate"]
    assert len(measured) == 2
    assert all(r.compile_status == "ok" and r.verify_status == "ok" for r in measured)
    assert (out / "tuning_spec.mlir").exists() and (out / "summary.md").exists()
    # Another input into the same directory: said, since its spec replaces this one.
    other = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune", str(FIXTURE), "--target", "host",
         "--budget", "1", "-o", str(out), "--repetitions", "2", "--confirm-top", "0"],
        capture_output=True, text=True, timeout=600,
    )
    assert other.returncode == 0, other.stderr[-2000:]
    assert "holds results of 1 dispatch(es) that" in other.stderr
    assert "tuning_spec.mlir is rewritten for this input only" in other.stderr


def test_failures_say_whether_they_may_be_transient() -> None:
    from dispatchtune.datasets.records import ResultRecord, transient_failure

    assert transient_failure("timeout", "timed out after 60 s")
    assert transient_failure("crashed", "killed by SIGKILL: ")  # e.g. the OOM killer under load
    assert transient_failure("error", "OSError: [Errno 28] No space left on device")
    assert transient_failure("failed", "error: No space left on device")
    assert not transient_failure("failed", "error: failed to build pass pipeline")
    assert not transient_failure("not_applied", "")
    # Logs written before the flag: classified from their statuses.
    legacy = ResultRecord({}, "p", "host", "", 1, compile_status="timeout")
    assert legacy.may_be_transient and not legacy.transient
    measured = ResultRecord({}, "p", "host", "", 2, bench_status="ok", times_ms=[1.0])
    assert not measured.failed and not measured.may_be_transient


def test_tune_says_it_disabled_const_eval_and_that_builds_with_the_spec_need_it(
    tmp_path: Path,
) -> None:
    """IREE 3.13 crashes in const-eval of the fixture (as of BERT's export): tune dumps its
    dispatches with --iree-opt-const-eval=false by itself, says that it did (the warning used to
    read as advice no flag of tune could follow), and the summary tells the spec's users."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune",
         str(FIXTURE.parent / "const_eval_crash_f32.mlir"), "--target", "host", "--budget", "1",
         "-o", str(out), "--repetitions", "2", "--confirm-top", "0", "--no-progress",
         "--min-speedup", "0.5"],  # a configuration in the spec: it is checked on the model too
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # The model-level check builds the model with the same flag (it used to fail to compile).
    assert "could not check the spec" not in proc.stderr
    assert "configures 1 of 1" in proc.stdout
    (warning,) = [line for line in proc.stderr.splitlines() if "const-eval" in line]
    assert "so dispatchtune built it with --iree-opt-const-eval=false" in warning
    assert "use the flag for this input" not in warning
    note = "tuned with `--iree-opt-const-eval=false`: compile it with that flag too"
    assert note in proc.stdout and note in (out / "summary.md").read_text()


def test_tune_says_iree_demotes_f64_to_f32(tmp_path: Path) -> None:
    """An f64 matmul is compiled (and so tuned) as f32 by IREE's default input pipeline: one
    warning says so, instead of the summary silently reading f32xf32->f32."""
    proc = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune", str(FIXTURE.parent / "matmul_f64.mlir"),
         "--target", "host", "--budget", "1", "-o", str(tmp_path / "out"), "--repetitions", "2",
         "--confirm-top", "0", "--no-progress"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (warning,) = [line for line in proc.stderr.splitlines() if "f64" in line]
    assert "1 root op(s) compute in f64 (linalg.matmul); IREE demotes f64 to f32" in warning
    assert "f32xf32->f32" in proc.stdout


def test_tune_checks_its_spec_against_the_whole_model(tmp_path: Path) -> None:
    """Each configuration is checked on its dispatch's benchmark; `tune` on a model then checks
    the written spec on the model itself, since IREE can give a dispatch another form there (a
    silent fallback to its default). Here the spec applies (no warning); checked against another
    model, every configuration is reported as not applied."""
    from dispatchtune.tuner.loop import spec_configs_not_applied

    model = Path(__file__).parent / "fixtures" / "mlp_two_matmuls.mlir"
    result = tune(model, HOST, tmp_path / "run", TuneOptions(
        budget=1, repetitions=2, confirm_top=0, min_speedup=0.5, verify=False, progress=False))
    kept = [s.problem.key for s in result.summaries if s.in_spec]
    assert kept  # --min-speedup 0.5 keeps whatever was measured
    assert spec_configs_not_applied(model, HOST, result) == []
    assert "Checked against the whole model" not in result.summary_path.read_text()
    assert sorted(spec_configs_not_applied(FIXTURE, HOST, result)) == sorted(kept)


def test_tune_says_when_no_dispatch_could_be_tuned(tmp_path: Path) -> None:
    """`tune` on a file whose only root op the search does not cover (a max pooling): exit 0 with
    a spec that keeps every default, and the headline says no dispatch could be tuned (it used to
    say that no candidate beat the compiler default, though none was tried)."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune",
         str(FIXTURE.parent / "cpu_maxpool_nchw_f32.mlir"), "--target", "host", "--budget", "1",
         "-o", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "None of the 1 dispatch(es) could be tuned on host" in proc.stdout
    assert "No candidate beat" not in proc.stdout
    assert "compilation_info" not in (out / "tuning_spec.mlir").read_text()

