"""End of a tuning run: pick the best candidates, write the spec, `summary.md` and the plot.

The best candidate of a dispatch is the verified (or unverifiable, never mismatching) candidate
with the highest speedup over the compiler default, each candidate normalised by the mean of the
baselines measured just before and just after it on its device. It enters `tuning_spec.mlir` only
when that speedup exceeds `min_speedup` (default 1.02: it beats the default by more than the
noise). When no dispatch has such a candidate, the spec written is an empty one that keeps every
default (so a build script can always pass it); if the spec builder cannot build an empty spec, no
spec file is written. The summary and the printed report say which case happened."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from dispatchtune.datasets.records import (
    ResultRecord,
    as_records,
    latest_attempts,
    records_frame,
)
from dispatchtune.datasets.timing import estimate, speedup
from dispatchtune.problem import Problem
from dispatchtune.targets import Target

logger = logging.getLogger(__name__)

#: Records as the loop reads them back (`read_results`), or their dict form (`read_records`).
Records = Iterable[ResultRecord | Mapping[str, Any]]


class ReportSettings(Protocol):
    """What the report needs of the run's options (`tuner.loop.TuneOptions` has it)."""

    min_speedup: float
    estimator: str
    compile_only: bool


@dataclass
class TuneResult:
    """Paths written by `tune` and the per-dispatch summaries."""

    output_dir: Path
    results_path: Path
    spec_path: Path
    summary_path: Path
    plot_path: Path | None
    summaries: list[Any] = field(default_factory=list)
    text: str = ""
    #: Dispatches the results log holds that this input does not have (another input tuned into
    #: the same directory): the spec written covers this input only.
    other_dispatches: list[str] = field(default_factory=list)


@dataclass
class DispatchSummary:
    """What a run found for one dispatch."""

    problem: Problem
    benchmarked: int = 0
    built: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)  # most common error messages
    duplicates: int = 0
    miscompiles: list[int] = field(default_factory=list)
    best: dict[str, Any] | None = None
    speedup: float = float("nan")
    speedup_low: float = float("nan")  # spread over the best candidate's repetitions
    speedup_high: float = float("nan")
    baseline_ms: list[float] = field(default_factory=list)  # median of each baseline measurement
    baseline_cv: float = 0.0  # coefficient of variation of every baseline repetition
    in_spec: bool = False
    confirm_rounds: int = 0  # interleaved re-measurement rounds behind `speedup` (0: screening)
    confirmed: pd.DataFrame | None = None
    frame: pd.DataFrame | None = None
    not_tuned: str = ""  # why this dispatch could not be tuned (the run went on without it)


#: Baseline CV above which the summary warns that the machine is too noisy to trust speedups
#: (a quiet local-sync run here has a CV of 1-6%).
NOISY_CV = 0.15

#: A diagnostic's `file:line:col: error:` prefix, at the start of a message or after a label
#: such as "killed by SIGABRT: " (the file is the run's own benchmark.mlir: it says nothing, and
#: its long path pushed the message itself past any width). Paths may hold spaces.
_LOCATION = re.compile(r"(?:^|(?<=: ))[^:\n]+:\d+:\d+:\s*(?:error:\s*)?")
#: Width of a failure reason on the console and in the summary: IREE's messages are one sentence
#: (the longest seen, a shared-memory overflow with its limit, is about 130 characters).
REASON_WIDTH = 200


def _reason(message: str, width: int = REASON_WIDTH) -> str:
    """An error line without its location prefix, for grouping failures: whole when it fits in
    `width`, else cut at the last word boundary (with "...") so no word is cut in half."""
    text = _LOCATION.sub("", message.strip().splitlines()[0] if message.strip() else "")
    if len(text) > width:
        cut = text[: width - 4]
        text = (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip(" ;:,") + " ..."
    return text or "no message"


def _bracket_baselines(
    frame: pd.DataFrame, records: Sequence[ResultRecord], estimator: str
) -> pd.DataFrame:
    """Normalise each candidate by the baselines just before and just after it on its device.

    The log stores the baseline measured before a candidate (all that is known when it is
    written); once the run is over, the faster of the two bracketing baseline medians is used.
    Measured on this shared VM: a burst of outside load doubled one baseline, and the mean of the
    bracketing pair credited an ordinary candidate with a 1.97x "speedup".
    """
    baselines = [r for r in records if r.is_baseline]
    base = pd.DataFrame(
        {
            "device": [r.device for r in baselines],
            "timestamp": [r.timestamp for r in baselines],
            "median": [estimate(r.times_ms, estimator) for r in baselines],
        }
    )
    frame = frame.copy()
    frame["time_ms"] = [estimate(t, estimator) for t in frame["times_ms"]]
    frame["baseline_ref_ms"] = np.nan
    if base.empty:
        frame["speedup"] = np.nan
        return frame
    for device, group in base.sort_values("timestamp").groupby("device"):
        rows = (frame["device"] == device).to_numpy()
        if not rows.any():
            continue
        stamps = group["timestamp"].to_numpy(dtype=float)
        medians = group["median"].to_numpy(dtype=float)
        when = frame.loc[rows, "timestamp"].to_numpy(dtype=float)
        after = np.searchsorted(stamps, when)
        before = np.clip(after - 1, 0, len(stamps) - 1)
        after = np.clip(after, 0, len(stamps) - 1)
        # The faster of the two: load from other jobs only ever slows a measurement down, so
        # this never credits a candidate with a speedup that came from a loaded baseline.
        frame.loc[rows, "baseline_ref_ms"] = np.minimum(medians[before], medians[after])
    frame["speedup"] = speedup(frame["baseline_ref_ms"].to_numpy(), frame["time_ms"].to_numpy())
    return frame


def _confirmation_plan(
    records: Sequence[ResultRecord], problem_key: str, target: str
) -> tuple[list[ResultRecord], int]:
    """The measurements of a dispatch's latest confirmation and how many it planned (0: none).

    The plan is the latest record's: the plan record a confirmation opens with (`is_confirm_plan`),
    or a measurement, which carries the plan it was taken under.
    """
    confirms = [r for r in records if r.is_confirm and r.belongs_to(problem_key, target)]
    if not confirms:
        return [], 0
    latest = [r for r in confirms if r.session == confirms[-1].session]
    measured = [r for r in latest if not r.is_confirm_plan]
    return measured, latest[-1].confirm_rounds * latest[-1].confirm_finalists


def latest_confirmation(
    records: Sequence[ResultRecord], problem_key: str, target: str
) -> tuple[list[ResultRecord], bool]:
    """The confirm measurements of a dispatch's latest confirmation, and whether it ran to the end.

    A confirmation opens with a plan record (rounds x finalists) before anything is measured, and
    each measurement carries the plan too; fewer measurements than planned means the run was
    interrupted, even before the first of them. Logs written before the plan was recorded count
    as complete, as they always did.
    """
    measured, planned = _confirmation_plan(records, problem_key, target)
    return measured, _complete(measured, planned)


def _complete(measured: Sequence[ResultRecord], planned: int) -> bool:
    return planned == 0 or len(measured) >= planned


def confirmation_pending(records: Sequence[ResultRecord], problem_key: str, target: str) -> bool:
    """Whether a dispatch's screening waits for a confirmation (with confirmation asked for): its
    latest one was interrupted, or candidates were benchmarked after it, or with none at all (a
    run killed between its last screening measurement and the confirmation's plan record)."""
    if not latest_confirmation(records, problem_key, target)[1]:
        return True
    last = max((i for i, r in enumerate(records)
                if r.is_confirm and r.belongs_to(problem_key, target)), default=-1)
    return any(r.is_candidate and r.bench_status == "ok" and r.belongs_to(problem_key, target)
               for r in records[last + 1:])


def decided_records(
    records: Sequence[ResultRecord], problem_keys: Sequence[str], target: str, warn: bool = False
) -> list[ResultRecord]:
    """The records a report decides from: superseded failed attempts, plan records and all but
    each dispatch's latest complete confirmation left out; an incomplete one is never used
    (`warn`: say so)."""
    records = latest_attempts(records)
    keep: set[int] = set()
    for key in problem_keys:
        measured, planned = _confirmation_plan(records, key, target)
        if _complete(measured, planned):
            keep.update(id(r) for r in measured)
        elif warn:
            logger.warning(
                "%s: the confirmation was interrupted (%d of %d measurements); the best candidate "
                "is chosen from screening alone: rerun the same command to confirm it",
                key, len(measured), planned)
    return [r for r in records if not r.is_confirm or id(r) in keep]


def summarize(
    records: Records,
    problem: Problem,
    target: Target,
    min_speedup: float,
    estimator: str = "min",
) -> DispatchSummary:
    """What the run found for one dispatch (see the module docstring for how the best is chosen)."""
    mine = decided_records([r for r in as_records(records) if r.belongs_to(problem.key, target.name)],
                           [problem.key], target.name)
    summary = DispatchSummary(problem)
    summary.baseline_ms = [estimate(r.times_ms, "median") for r in mine if r.is_baseline]
    base_times = np.asarray([t for r in mine if r.is_baseline for t in r.times_ms], dtype=float)
    if base_times.size > 1:
        summary.baseline_cv = float(base_times.std() / base_times.mean())
    frame = records_frame(mine)
    summary.frame = frame
    if frame.empty:
        return summary
    frame = _bracket_baselines(frame.sort_values("timestamp", kind="stable"), mine, estimator)
    summary.frame = frame
    benched = frame[frame["bench_status"] != "skipped"]
    summary.benchmarked = len(benched)
    summary.built = int((frame["compile_status"] == "ok").sum())
    failed = frame[
        ~frame["compile_status"].isin(["ok", "duplicate"]) | ~frame["bench_status"].isin(
            ["ok", "skipped"]
        )
    ]
    reasons = np.where(
        failed["compile_status"] != "ok",
        "compile " + failed["compile_status"].astype(str),
        "benchmark " + failed["bench_status"].astype(str),
    )
    summary.failures = {str(k): int(v) for k, v in pd.Series(reasons).value_counts().items()}
    messages = np.where(
        failed["compile_status"] != "ok",
        failed["compile_error"].astype(str),
        failed["bench_error"].astype(str),
    )
    summary.reasons = {
        str(k): int(v)
        for k, v in pd.Series([_reason(m) for m in messages]).value_counts().head(5).items()
    }
    summary.duplicates = int((frame["compile_status"] == "duplicate").sum())
    summary.miscompiles = [
        int(c) for c in frame.loc[frame["verify_status"] == "mismatch", "candidate_id"]
    ]
    usable = usable_candidates(frame)
    if usable.empty:
        return summary
    confirmed = confirmations(mine, estimator)
    if not confirmed.empty:
        # The interleaved re-measurements decide: screening picked the finalists, and one
        # screening measurement is too noisy on a shared machine to name the winner.
        top = confirmed.iloc[0]
        match = usable[usable["candidate_id"] == top["candidate_id"]]
        best = match.iloc[0] if not match.empty else usable.iloc[0]
        summary.speedup = float(top["speedup"])
        summary.speedup_low, summary.speedup_high = float(top["low"]), float(top["high"])
        summary.confirm_rounds = int(top["rounds"])
        summary.confirmed = confirmed
    else:
        best = usable.iloc[0]
        summary.speedup = float(best["speedup"])
        per_rep = speedup(float(best["baseline_ref_ms"]), np.asarray(best["times_ms"], dtype=float))
        summary.speedup_low, summary.speedup_high = float(per_rep.min()), float(per_rep.max())
    summary.best = {str(k): v for k, v in best.items()}
    summary.in_spec = summary.speedup > min_speedup
    return summary


def usable_candidates(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured, not miscompiled candidates, fastest (normalised) first."""
    if frame.empty:
        return frame
    ok = (
        (frame["bench_status"] == "ok")
        & (frame["verify_status"] != "mismatch")
        & frame["speedup"].notna()
    )
    return frame[ok].sort_values("speedup", ascending=False, kind="stable")


def confirmations(records: Records, estimator: str = "min") -> pd.DataFrame:
    """Per confirmed candidate: median speedup over its rounds, range over rounds x repetitions.

    Each `confirm` record is one round of one finalist; a baseline is measured before every round
    and after the last, and each round is judged against the faster of the two baselines around
    it (as in screening), so every ratio compares measurements taken seconds apart and a burst of
    outside load on one baseline cannot make a finalist look fast.
    """
    typed = as_records(records)
    confirm = [r for r in typed if r.is_confirm and r.times_ms and r.bench_status == "ok"]
    if not confirm:
        return pd.DataFrame(columns=["candidate_id", "speedup", "low", "high", "rounds"])
    frame = _bracket_baselines(records_frame(confirm, kinds=("confirm",)), typed, estimator)
    frame = frame[frame["baseline_ref_ms"].notna()]
    if frame.empty:
        return pd.DataFrame(columns=["candidate_id", "speedup", "low", "high", "rounds"])
    per_rep = [
        speedup(float(b), np.asarray(t, dtype=float))
        for b, t in zip(frame["baseline_ref_ms"], frame["times_ms"], strict=True)
    ]
    frame = frame.assign(
        ratio=frame["speedup"],
        low=[float(r.min()) for r in per_rep],
        high=[float(r.max()) for r in per_rep],
    )
    grouped = frame.groupby("candidate_id").agg(
        speedup=("ratio", "median"), low=("low", "min"), high=("high", "max"),
        rounds=("ratio", "size"),
    )
    return grouped.reset_index().sort_values("speedup", ascending=False, kind="stable")


def _fmt_ms(values: Sequence[float]) -> str:
    arr = np.asarray(values, dtype=float)
    return f"{np.median(arr):.3f} ms (min {arr.min():.3f}, max {arr.max():.3f}, n={arr.size})"


def describe(summary: DispatchSummary) -> list[str]:
    """Console lines for one dispatch."""
    lines = [f"{summary.problem.key}: {summary.problem.describe()}"]
    if summary.not_tuned:
        lines.append(f"  not tuned: {summary.not_tuned}")
    lines.append(
        f"  built {summary.built}, benchmarked {summary.benchmarked}, "
        f"duplicates {summary.duplicates}, "
        f"failures: " + (
            ", ".join(f"{k} {v}" for k, v in sorted(summary.failures.items())) or "none"
        )
    )
    for reason, count in summary.reasons.items():
        lines.append(f"    {count} x {reason}")
    if summary.baseline_ms:
        drift = summary.baseline_ms
        lines.append(
            f"  default config: {len(drift)} baseline measurements, medians "
            f"{min(drift):.3f}-{max(drift):.3f} ms (first {drift[0]:.3f}, last {drift[-1]:.3f})"
        )
        if summary.baseline_cv > NOISY_CV:
            lines.append(
                f"  WARNING: the default config's repetitions vary by {summary.baseline_cv:.0%} "
                "(CV): other processes are loading the machine and speedups are unreliable; "
                "re-run on a quiet machine (results so far are kept)"
            )
    if summary.miscompiles:
        lines.append(f"  MISCOMPILES (output differs from default): {summary.miscompiles}")
    best = summary.best
    if best is None:
        if summary.built and not summary.benchmarked and not summary.baseline_ms:
            lines.append("  compile-only: nothing was benchmarked")
        elif not summary.not_tuned:  # else the reason above says why nothing was tried
            lines.append("  no candidate was measured successfully")
        return lines
    lines.append(
        # Screening times: the speedup below may come from the confirmation rounds instead.
        f"  best: candidate {best['candidate_id']} {best.get('pipeline', '')} screening "
        f"{_fmt_ms(best['times_ms'])} vs default {best['baseline_ref_ms']:.3f} ms"
    )
    verdict = (
        "written to the spec"
        if summary.in_spec
        else "NOT faster than the default; the spec keeps the default"
    )
    how = (
        f"confirmed in {summary.confirm_rounds} round(s) interleaved with the default"
        if summary.confirm_rounds
        # The progress lines compare with the default measured just before a candidate; here
        # the faster of the measurements before and after it counts (`_bracket_baselines`), so
        # a drifting machine can show a higher "best" there than here.
        else "single screening measurement, against the faster of the default's measurements "
        "just before and after it"
    )
    lines.append(
        f"  speedup {summary.speedup:.3f}x ({how}; repetitions {summary.speedup_low:.3f}-"
        f"{summary.speedup_high:.3f}x), verify {best['verify_status']}: {verdict}"
    )
    unchecked = str(best.get("verify_error") or "")
    if best["verify_status"] == "skipped" and unchecked:
        # Otherwise only the results log says why the outputs went unchecked.
        lines.append(f"  outputs not checked: {_reason(unchecked)}")
    lines.append(f"  config: {' '.join(str(best['compilation_info']).split())}")
    return lines


def plot_progress(summaries: Sequence[DispatchSummary], path: Path) -> Path | None:
    """Best-so-far speedup over the default against the number of benchmarks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    plotted = False
    for summary in summaries:
        frame = summary.frame
        if frame is None or frame.empty:
            continue
        benched = frame[frame["bench_status"] != "skipped"]
        ok = (benched["bench_status"] == "ok") & (benched["verify_status"] != "mismatch")
        speedup = np.where(ok, benched["speedup"].to_numpy(dtype=float), np.nan)
        if speedup.size == 0:
            continue
        best = np.fmax.accumulate(np.nan_to_num(speedup, nan=0.0))
        x = np.arange(1, speedup.size + 1)
        label = summary.problem.key[:40]
        ax.scatter(x, speedup, s=10, alpha=0.5)
        ax.step(x, best, where="post", label=f"{label} (best so far)")
        plotted = True
    if not plotted:
        plt.close(fig)
        return None
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="compiler default")
    ax.set_xlabel("benchmarks")
    ax.set_ylabel("speedup over default (x)")
    ax.set_title("dispatchtune: best candidate so far")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


_TABLE_KNOBS = (
    "tile_b", "tile_m", "tile_n", "tile_k", "vec_m", "vec_n", "intrinsic", "subgroups_m",
    "subgroups_n", "workgroup_threads", "prefetch_stages",
)


def _present(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, float) and math.isnan(value):
        return False
    return str(value) not in ("", "nan", "None", "-1")


def _short(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _markdown(
    summaries: Sequence[DispatchSummary], target: Target, plot: Path | None, spec_note: str
) -> str:
    out = [f"# dispatchtune summary ({target.name})", "", spec_note, ""]
    for summary in summaries:
        out.append(f"## {summary.problem.key}")
        out.append("")
        out.extend(f"- {line.strip()}" for line in describe(summary)[1:])
        out.append("")
        frame = summary.frame
        if frame is None or frame.empty:
            continue
        top = frame[frame["bench_status"] == "ok"].sort_values("speedup", ascending=False).head(10)
        confirmed: dict[int, float] = {}
        if summary.confirmed is not None:
            confirmed = dict(
                zip(summary.confirmed["candidate_id"].astype(int), summary.confirmed["speedup"],
                    strict=True)
            )
        if not top.empty:
            out.append(
                "| candidate | rank | pipeline | knobs | time ms | screening speedup | "
                "confirmed speedup | verify |"
            )
            out.append("|---|---|---|---|---|---|---|---|")
            for _, row in top.iterrows():
                knobs = " ".join(
                    f"{k}={_short(row[k])}"
                    for k in _TABLE_KNOBS
                    if k in row and _present(row[k])
                    # GPU-only knobs read 0 on CPU rows
                    and (k.startswith(("tile_", "vec_")) or _short(row[k]) != "0")
                )
                again = confirmed.get(int(row["candidate_id"]))
                out.append(
                    f"| {row['candidate_id']} | {row.get('rank', '')} | {row.get('pipeline', '')} "
                    f"| {knobs} | {row['time_ms']:.3f} | {row['speedup']:.3f} | "
                    f"{'' if again is None else f'{again:.3f}'} | {row['verify_status']} |"
                )
            out.append("")
            if summary.best is not None:
                config = " ".join(str(summary.best["compilation_info"]).split())
                out.append(f"Best configuration: `{config}`")
                out.append("")
        failed = frame[~frame["compile_status"].isin(["ok", "duplicate"])]
        if not failed.empty:
            out.append("Failures (first 10):")
            out.append("")
            for _, row in failed.head(10).iterrows():
                out.append(
                    f"- candidate {row['candidate_id']}: {row['compile_status']}: "
                    f"{_reason(str(row['compile_error']))}"
                )
            out.append("")
    if plot is not None:
        out.append(f"![best so far]({plot.name})")
        out.append("")
    return "\n".join(out)


def write_outputs(
    records: Records,
    problems: Sequence[Problem],
    target: Target,
    out: Path,
    options: ReportSettings,
    not_tuned: Mapping[str, str] | None = None,
    notes: Sequence[str] = (),
) -> TuneResult:
    """Write `tuning_spec.mlir`, `summary.md`, `progress.png`; return the paths and summaries.

    `not_tuned` maps a problem key to why that dispatch could not be tuned; the summary says so.
    `notes` (how the input was built, e.g. a flag the spec's users need too) follow the note on
    the spec, in the summary and in the printed report.
    """
    from dispatchtune.measure.builder import write_spec_file

    records = as_records(records)
    others = sorted({r.problem_key for r in records} - {p.key for p in problems})
    records = decided_records(records, [p.key for p in problems], target.name, warn=True)
    summaries = [
        summarize(records, p, target, options.min_speedup, options.estimator) for p in problems
    ]
    for summary in summaries:
        summary.not_tuned = (not_tuned or {}).get(summary.problem.key, "")
    entries = [
        (s.problem, str(s.best["compilation_info"])) for s in summaries if s.in_spec and s.best
    ]
    if options.compile_only:
        entries = []
    spec_path = out / "tuning_spec.mlir"
    # With no entries this is a valid spec that keeps every default configuration.
    write_spec_file(entries, spec_path)
    untunable = sum(1 for s in summaries if s.not_tuned)
    if summaries and untunable == len(summaries):
        spec_note = (
            f"None of the {len(summaries)} dispatch(es) could be tuned on {target.name} (each "
            "says why above): `tuning_spec.mlir` is a valid spec that keeps every default "
            "configuration."
        )
    elif options.compile_only:
        built = sum(s.built for s in summaries)
        spec_note = (f"Compile-only run: {built} candidate(s) were built and checked, none was "
                     "benchmarked" + (f"; {untunable} of {len(summaries)} dispatch(es) could not "
                                      "be tuned." if untunable else "."))
    elif entries:
        spec_note = (
            f"`tuning_spec.mlir` configures {len(entries)} of {len(summaries)} dispatch(es); "
            f"pass it with `{' '.join(target.tuning_spec_flags('tuning_spec.mlir'))}` (IREE "
            "3.13 can hang applying a spec on several threads)."
        )
    else:
        spec_note = (
            "No candidate beat the compiler default: `tuning_spec.mlir` is a valid spec that keeps "
            "every default configuration."
        )
    spec_note = " ".join([spec_note, *notes])
    plot = plot_progress(summaries, out / "progress.png")
    summary_path = out / "summary.md"
    summary_path.write_text(_markdown(summaries, target, plot, spec_note))
    text_lines = [line for s in summaries for line in describe(s)]
    text_lines += [spec_note, f"results: {out / 'results.jsonl'}  summary: {summary_path}"]
    return TuneResult(
        output_dir=out,
        results_path=out / "results.jsonl",
        spec_path=spec_path,
        summary_path=summary_path,
        plot_path=plot,
        summaries=summaries,
        text="\n".join(text_lines),
        other_dispatches=others,
    )


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
