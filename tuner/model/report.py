"""Reporting whole-model tuning: the result, the console lines, `summary.md` and the plot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatchtune.datasets.timing import speedup
from dispatchtune.targets import Target
from dispatchtune.tuner.model.profile import DispatchShare, dispatch_index
from dispatchtune.tuner.model.steps import NO_CONST_EVAL

if TYPE_CHECKING:
    from dispatchtune.tuner.model.steps import ModelStep, _ModelTuner


@dataclass
class ModelTuneResult:
    """What `tune_model` measured and wrote (`text`: the console summary)."""

    output_dir: Path
    spec_path: Path
    summary_path: Path
    plot_path: Path | None
    results_path: Path
    default_ms: list[float]
    tuned_ms: list[float]
    speedup: float
    speedup_low: float
    speedup_high: float
    verify_status: str
    max_abs_error: float | None
    shares: list[DispatchShare]
    other_ms: float
    steps: list[ModelStep]
    kept: dict[str, int]
    text: str = ""

    @property
    def tuned_share(self) -> float:
        """Share of the model's dispatch time in problems that were tuned (not skipped)."""
        return sum(s.share for s in self.shares if s.budget and not s.skip_reason)

    @property
    def tuned_faster(self) -> int:
        """Final rounds in which the tuned build was faster (a 1.00x median won by chance or not)."""
        return sum(d > t for d, t in zip(self.default_ms, self.tuned_ms, strict=True))

    @property
    def skipped(self) -> list[DispatchShare]:
        """Problems not tuned, slowest first; each has its `skip_reason`."""
        return [s for s in self.shares if s.skip_reason]



def _per_round(times: Sequence[Sequence[float]]) -> np.ndarray:
    return np.asarray([min(t) for t in times], dtype=float)


def write_result(
    out: Path, target: Target, tuner: _ModelTuner, profile: dict[str, Any],
    shares: list[DispatchShare], other_ms: float, total_ms: float, steps: list[ModelStep],
    kept: list[tuple[str, int]], final: dict[str, Any],
) -> ModelTuneResult:
    default = _per_round(final["default_times_ms"])
    tuned = _per_round(final["tuned_times_ms"])
    ratios = speedup(default, tuned)
    result = ModelTuneResult(
        output_dir=out, spec_path=out / "tuning_spec.mlir", summary_path=out / "summary.md",
        plot_path=None, results_path=out / "dispatches" / "results.jsonl",
        default_ms=default.tolist(), tuned_ms=tuned.tolist(),
        speedup=float(np.median(ratios)), speedup_low=float(ratios.min()),
        speedup_high=float(ratios.max()), verify_status=str(final.get("verify_status") or ""),
        max_abs_error=final.get("max_abs_error"), shares=shares, other_ms=other_ms,
        steps=steps, kept=dict(kept),
    )
    result.plot_path = plot_model(result, out / "model_tuning.png")
    lines = _summary_lines(result, target, tuner, profile, total_ms)
    result.summary_path.write_text("\n".join(lines) + "\n")
    result.text = "\n".join(_console_lines(result, target))
    return result


def _ms(values: np.ndarray | Sequence[float]) -> str:
    arr = np.asarray(values, dtype=float)
    return f"{np.median(arr):.3f} ms (min {arr.min():.3f}, max {arr.max():.3f})"


def _console_lines(result: ModelTuneResult, target: Target) -> list[str]:
    lines = [
        f"default model: {_ms(result.default_ms)} over {len(result.default_ms)} rounds",
        f"tuned model:   {_ms(result.tuned_ms)}",
        f"speedup {result.speedup:.3f}x (rounds {result.speedup_low:.3f}-"
        f"{result.speedup_high:.3f}x, tuned faster in {result.tuned_faster} of "
        f"{len(result.tuned_ms)}); outputs vs default build: {result.verify_status}"
        + ("" if result.kept else " (no configuration was kept: both builds are the compiler "
           "default, so the speedup is measurement noise)"),
    ]
    for step in result.steps:
        lines.append(
            f"  {step.key}: " + (f"kept candidate {step.kept}" if step.kept is not None
                                 else f"default kept ({step.note})")
        )
    lines.append(f"tuned problems cover {result.tuned_share:.1%} of the model's dispatch time")
    # Problems left out by the selection knobs are in summary.md; the console names the others,
    # and a knob that kept the coverage short of its goal (the reason says "coverage stops at").
    refused = [s for s in result.skipped
               if not s.skip_reason.startswith(("below --min-share", "outside --coverage"))
               or "coverage stops at" in s.skip_reason]
    by_reason: dict[str, list[DispatchShare]] = {}
    for share in refused:
        by_reason.setdefault(share.skip_reason, []).append(share)
    for reason, group in by_reason.items():
        names = group[0].key if len(group) == 1 else f"{len(group)} problems"
        lines.append(f"  not tuned: {names} ({sum(s.share for s in group):.1%}): {reason}")
    lines.append(
        f"spec: {result.spec_path} ({len(result.kept)} configuration(s); pass it with "
        f"{target.tuning_spec_flag}=...)  summary: {result.summary_path}"
    )
    return lines


def _summary_lines(
    result: ModelTuneResult, target: Target, tuner: _ModelTuner, profile: dict[str, Any],
    total_ms: float,
) -> list[str]:
    steps = {s.key: s for s in result.steps}
    flags = " ".join(profile.get("compile_flags", []))
    lines = [
        f"# dispatchtune tune-model summary ({target.name})",
        "",
        f"Model `{profile.get('model')}`, function `@{profile.get('function')}`, device "
        f"`{profile.get('device')}`, IREE {profile.get('iree_version')}.",
        *(["", f"Lowered from the torch-dialect export `{profile.get('source')}`."]
          if profile.get("source", profile.get("model")) != profile.get("model") else []),
        *(["", f"The default build failed, so every build of this run disables constant "
           f"evaluation (`{NO_CONST_EVAL}`)."]
          if NO_CONST_EVAL in profile.get("compile_flags", []) else []),
        "",
        "## End to end",
        "",
        f"Measured in {len(result.default_ms)} rounds, each benchmarking the default and the tuned "
        f"build back to back ({tuner.options.repetitions} repetitions each, {tuner.timer} time; "
        "a round's time is its fastest repetition, since outside load only slows runs down)."
        + ("" if result.kept else " No configuration was kept, so both rows are the compiler "
           "default build: their spread is the measurement noise."),
        "",
        "| build | median ms | min ms | max ms |",
        "|---|---:|---:|---:|",
    ]
    for label, values in (("compiler default", result.default_ms),
                          ("tuned (`tuning_spec.mlir`)", result.tuned_ms)):
        arr = np.asarray(values)
        lines.append(f"| {label} | {np.median(arr):.3f} | {arr.min():.3f} | {arr.max():.3f} |")
    err = result.max_abs_error
    lines += [
        "",
        f"**Speedup {result.speedup:.3f}x** (median of the paired rounds; range "
        f"{result.speedup_low:.3f}-{result.speedup_high:.3f}x; tuned faster in "
        f"{result.tuned_faster} of {len(result.tuned_ms)} rounds). Outputs of the tuned build vs the "
        f"default build on seeded random inputs: **{result.verify_status}**"
        + (f" (max abs error {err:.3g})" if isinstance(err, (int, float)) else "") + ".",
        "",
        f"`tuning_spec.mlir` configures {len(result.kept)} problem(s). Reproduce:",
        "",
        "```sh",
        f"iree-compile {profile.get('model')} {flags} \\",
        f"    {' '.join(target.tuning_spec_flags(result.spec_path))} -o model.vmfb",
        "```",
        "",
        "## Where the time goes",
        "",
        f"Profile of the default build (`iree-benchmark-module --dispatch_statistics`): "
        f"{total_ms:.3f} ms of dispatches per call. A spec configures every dispatch of the same "
        "shape, so dispatches are grouped by problem.",
        "",
        f"Tuned problems cover **{result.tuned_share:.1%}** of it; every problem not tuned is "
        "listed with its reason under \"Not tuned\".",
        "",
        "| problem | dispatches | calls | ms | share | budget | best isolated speedup | "
        "model speedup | in spec |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for share in result.shares:
        step = steps.get(share.key)
        isolated = model = ""
        if step is not None and step.tried:
            isolated = f"{max(t['dispatch_speedup'] for t in step.tried):.3f}x"
            measured = [t for t in step.tried if "model_speedup" in t]
            if measured:
                model = f"{max(t['model_speedup'] for t in measured):.3f}x"
        names = ", ".join(str(dispatch_index(d)) for d in share.dispatches)
        kept = "yes" if share.key in result.kept else ("no" if step is not None else "")
        lines.append(
            f"| `{share.key}` | {names} | {share.calls} | {share.time_ms:.3f} | "
            f"{share.share:.1%} | {share.budget or ''} | {isolated} | {model} | {kept} |"
        )
    lines += [f"| other (no tunable root op) | | | {result.other_ms:.3f} | "
              f"{result.other_ms / total_ms if total_ms else 0:.1%} | | | | |", ""]
    lines += ["## Not tuned", ""]
    if result.skipped:
        lines += ["| problem | share | reason |", "|---|---:|---|"]
        lines += [f"| `{s.key}` | {s.share:.1%} | {s.skip_reason} |" for s in result.skipped]
    else:
        lines.append("Every problem with a tunable root op was tuned.")
    lines.append("")
    lines += ["## Model-level decisions", ""]
    if not result.steps:
        lines.append("No dispatch was tuned.")
    for step in result.steps:
        verdict = (f"kept candidate {step.kept}" if step.kept is not None
                   else f"default kept: {step.note}")
        lines.append(f"- `{step.key}`: {verdict}")
        for t in step.tried:
            detail = (f"model {t['model_speedup']:.3f}x (rounds "
                      f"{min(t['ratios']):.3f}-{max(t['ratios']):.3f}x"
                      + (f"; faster in {t['wins']}/{t['rounds']}, sign test p={t['p_value']:.3f}"
                         if "p_value" in t else "") + ")"
                      if "model_speedup" in t else f"{t.get('status')}: {t.get('error', '')}")
            how = "confirmed" if t.get("confirmed") else "screening"
            lines.append(f"  - candidate {t['candidate_id']}: isolated {t['dispatch_speedup']:.3f}x "
                         f"({how}), {detail}")
    lines += [
        "",
        "Dispatch-level results: `dispatches/results.jsonl` (the dispatch loop's format; "
        "`train-costmodel` reads it) and `dispatches/summary.md`; model-level measurements: "
        "`model_log.jsonl`.",
        "",
    ]
    if result.plot_path is not None:
        lines.append(f"![share and gain per problem]({result.plot_path.name})")
    return lines


def plot_model(result: ModelTuneResult, path: Path) -> Path | None:
    """Bar chart per problem: share of the model's time, isolated and model-level speedups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shares = result.shares[:10]
    if not shares:
        return None
    steps = {s.key: s for s in result.steps}
    labels = [s.key.rsplit("_", 1)[0].replace("contraction_", "mm ") for s in shares]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.5 * len(shares) + 2.2))
    y = np.arange(len(shares))
    left.barh(y, [100 * s.share for s in shares], color="tab:blue")
    left.set_yticks(y, labels, fontsize=7)
    left.invert_yaxis()
    left.set_xlabel("share of the default model's dispatch time (%)")
    isolated, model = [], []
    for share in shares:
        step = steps.get(share.key)
        tried = step.tried if step is not None else []
        isolated.append(max((t["dispatch_speedup"] for t in tried), default=np.nan))
        model.append(max((t["model_speedup"] for t in tried if "model_speedup" in t),
                         default=np.nan))
    right.barh(y - 0.2, isolated, height=0.4, label="best dispatch alone", color="tab:gray")
    right.barh(y + 0.2, model, height=0.4, label="whole model with it", color="tab:green")
    right.axvline(1.0, color="black", linewidth=1, linestyle="--")
    right.set_yticks(y, [""] * len(shares))
    right.invert_yaxis()
    right.set_xlabel("speedup over the compiler default (x)")
    finite = [v for v in isolated + model if np.isfinite(v)]
    if finite:
        right.set_xlim(min(0.9, min(finite) - 0.02), max(finite) + 0.05)
    right.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"tune-model: end-to-end {result.speedup:.3f}x "
                 f"({_ms(result.default_ms).split(' (')[0]} -> {_ms(result.tuned_ms).split(' (')[0]})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
