"""`train-costmodel INPUTS... --model gbm|rf|lambdarank --output PATH`: train, cross-validate, save.

Inputs are measured spaces: dispatchtune `results.jsonl` logs (a file, a tune output directory, or
a directory of such directories, e.g. the output of `datasets/collect_cpu.py`) and Kernel Tuner
cache files (`.json` / `.json.gz`; GEMM spaces). Each (problem, target) of a log and each cache is
one *problem*; labels are normalised per problem (`costmodel.learned`).

Cross-validation holds whole problems out (leave-one-problem-out, or `--folds K` groups of
problems): the model is trained on the other problems and judged on the held-out ones by the
benchmarks it needs until the first candidate within 5% of the best (exact expectation over ties,
`expected_benchmarks_with_ties`), next to the exact random expectation (N+1)/(k+1) and the
handwritten heuristic on the same rows. Then the model is trained on everything and saved
(`costmodel.modelfile`) with the report in its metadata; the report is printed and written to
`<output stem>.report.md` with a plot `<output stem>.report.png` (for `--output m.json`:
`m.report.md`, `m.report.png`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from dispatchtune.costmodel.heuristic import HeuristicModel
from dispatchtune.costmodel.learned import MODELS, LearnedModel, labels_from_times, make_model
from dispatchtune.costmodel.metrics import (
    expected_benchmarks_with_ties,
    near_optimal,
    random_expected_benchmarks,
)
from dispatchtune.datasets.shipped import resolve
from dispatchtune.errors import InputError
from dispatchtune.features.extract import FEATURE_NAMES

#: Most candidate pairs sampled per problem for the pairwise accuracy.
PAIR_SAMPLE = 100_000
#: Pairs whose times differ by less than this fraction are measurement noise: not counted.
PAIR_MIN_DIFFERENCE = 0.01


# ---- data --------------------------------------------------------------------------------------
@dataclass
class TrainingData:
    """Rows of many measured problems: features, times and the problem of each row."""

    features: pd.DataFrame  # columns FEATURE_NAMES
    times: np.ndarray  # ms, > 0
    groups: np.ndarray  # problem label of each row
    sources: dict[str, str] = field(default_factory=dict)  # problem label -> where it came from

    @property
    def problems(self) -> list[str]:
        return list(dict.fromkeys(self.groups.tolist()))

    def subset(self, mask: np.ndarray) -> TrainingData:
        return TrainingData(self.features[mask].reset_index(drop=True), self.times[mask],
                            self.groups[mask], self.sources)

    def summary(self) -> dict[str, Any]:
        counts = pd.Series(self.groups).value_counts(sort=False)
        return {
            "rows": len(self.times),
            "problems": len(counts),
            "per_problem": {str(k): int(v) for k, v in counts.items()},
            "sources": sorted(set(self.sources.values())),
        }


def _classify(paths: Sequence[str | Path]) -> tuple[list[Path], list[Path]]:
    """Split inputs into results.jsonl files and Kernel Tuner caches."""
    logs: list[Path] = []
    caches: list[Path] = []
    for raw in paths:
        path = resolve(raw)
        if path.is_dir():
            found = [path / "results.jsonl"] if (path / "results.jsonl").exists() else sorted(
                path.glob("*/results.jsonl"))
            if not found:
                raise InputError(f"{path}: no results.jsonl in it or in its subdirectories")
            logs.extend(found)
        elif not path.exists():
            raise InputError(f"no such file: {path}")
        elif path.name.endswith((".jsonl", ".jsonl.gz")):
            logs.append(path)
        elif path.name.endswith((".json", ".json.gz")):
            caches.append(path)
        else:
            raise InputError(f"{path}: expected a results.jsonl(.gz) log, a tune output directory, "
                             "a Kernel Tuner cache (.json/.json.gz) or shipped:NAME")
    return logs, caches


def load_training_data(
    paths: Sequence[str | Path], time_column: str = "min_ms", progress: bool = False
) -> TrainingData:
    """Feature rows, times and problem labels of every measured space in `paths`.

    Log rows count when they compiled, ran and did not fail verification; a candidate measured in
    several sessions counts once (median over sessions of `time_column`: `min_ms` = the tuning
    loop's default estimator, or `median_ms`). Problems with fewer than 2 valid rows are dropped.
    """
    if time_column not in ("min_ms", "median_ms"):
        raise InputError(f"unknown time column {time_column!r}; use min_ms or median_ms")
    logs, caches = _classify(paths)
    parts: list[tuple[str, str, pd.DataFrame, np.ndarray]] = []
    for path in tqdm(caches, desc="Kernel Tuner caches", disable=not progress):
        parts.extend(part[:4] for part in kerneltuner_spaces(path))
    if logs:
        parts.extend(part[:4] for part in results_spaces(logs, time_column, progress))
    parts = [p for p in parts if len(p[3]) >= 2]
    if not parts:
        raise InputError("no measured problem with at least 2 valid candidates in the inputs")
    labels = [label for label, *_ in parts]
    if len(set(labels)) != len(labels):
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        raise InputError(f"problem {dupes[0]!r} is given twice; pass each space once")
    return TrainingData(
        features=pd.concat([p[2] for p in parts], ignore_index=True)[list(FEATURE_NAMES)],
        times=np.concatenate([p[3] for p in parts]),
        groups=np.concatenate([np.full(len(p[3]), p[0], dtype=object) for p in parts]),
        sources={label: source for label, source, *_ in parts},
    )


def kerneltuner_spaces(path: Path) -> list[tuple[str, str, pd.DataFrame, np.ndarray, pd.DataFrame]]:
    """(label, source, features, times, raw knobs) of a Kernel Tuner GEMM cache's valid rows."""
    from dispatchtune.datasets.kerneltuner import load_kerneltuner

    space = load_kerneltuner(path)
    if not space.is_gemm:
        warnings.warn(f"{path}: kernel {space.kernel_name!r} is not a GEMM space; skipped",
                      stacklevel=2)
        return []
    valid = space.valid.reset_index(drop=True)
    p = space.problem_scalars()
    label = f"{space.device_name} GEMM {p.m}x{p.n}x{p.k}"
    return [(label, f"Kernel Tuner {path.name}", space.features(valid),
             valid["time_ms"].to_numpy(dtype=np.float64), valid[list(space.tune_params_keys)])]


def results_spaces(
    logs: Sequence[Path], time_column: str = "min_ms", progress: bool = False
) -> list[tuple[str, str, pd.DataFrame, np.ndarray, pd.DataFrame]]:
    """(label, source, features, times, raw knobs) of each (problem, target) in results logs."""
    from dispatchtune.datasets.records import load_results
    from dispatchtune.features.extract import extract_features
    from dispatchtune.problem import Problem
    from dispatchtune.targets import record_target

    frame = load_results(list(logs))
    if frame.empty:
        return []
    ok = frame["compile_status"] == "ok"
    if "bench_status" in frame:
        ok &= frame["bench_status"] == "ok"
    if "verify_status" in frame:
        ok &= frame["verify_status"] != "mismatch"
    ok &= np.isfinite(frame[time_column].to_numpy(dtype=np.float64))
    ok &= frame[time_column].to_numpy(dtype=np.float64) > 0
    frame = frame[ok]
    parts: list[tuple[str, str, pd.DataFrame, np.ndarray, pd.DataFrame]] = []
    groups = frame.groupby(["problem_key", "target", "target_cpu"], sort=True)
    for (key, target_name, cpu), group in tqdm(groups, desc="logged problems", disable=not progress):
        # A candidate measured in several sessions counts once, with its median over sessions.
        first = {c: "first" for c in group.columns if c not in ("candidate_id", time_column)}
        group = group.groupby("candidate_id", sort=True).agg(
            {**first, time_column: "median"}).reset_index()
        problem = Problem.from_dict(group["problem"].iloc[0])
        target = record_target(str(target_name), str(cpu))
        features = extract_features(problem, target, group)
        label = f"{target.name} {problem.describe()} [{key}]"
        knobs = _logged_knobs(group)
        parts.append((label, "results.jsonl", features,
                      group[time_column].to_numpy(dtype=np.float64), knobs))
    return parts


def _logged_knobs(group: pd.DataFrame) -> pd.DataFrame:
    """The knob columns of one problem's logged candidates (`records_frame` flattens each
    record's knobs into columns); knobs that never vary within the problem are left out."""
    from dispatchtune.datasets.records import DERIVED_COLUMNS, ResultRecord

    fields = (set(ResultRecord.__dataclass_fields__) | set(DERIVED_COLUMNS)) - {"pipeline"}
    names = [c for c in group.columns if c not in fields]
    # The solver's own variables (`knob_*`) are the search dimensions; the table's other columns
    # (tile_m, workgroups, ...) are derived from them.
    raw = [c for c in names if c.startswith("knob_")]
    names = raw or names
    knobs = group[names].reset_index(drop=True)
    varying = [c for c in names if knobs[c].astype(str).nunique() > 1]
    return knobs[varying]


# ---- metrics of one held-out problem ----------------------------------------------------------
def _order(scores: np.ndarray, seed: int) -> np.ndarray:
    """The order `rank` produces: score descending, ties broken by a seeded draw."""
    from dispatchtune.costmodel.order import order_by_score

    return order_by_score(scores, seed)


def pairwise_accuracy(scores: np.ndarray, times: np.ndarray, seed: int = 0) -> float:
    """Share of candidate pairs (times > 1% apart) the scores order correctly; score ties = 1/2.

    Up to `PAIR_SAMPLE` random pairs (all pairs of small problems).
    """
    n = len(times)
    if n < 2:
        return float("nan")
    if n * (n - 1) // 2 <= PAIR_SAMPLE:
        i, j = np.triu_indices(n, k=1)
    else:
        rng = np.random.default_rng(seed)
        i, j = rng.integers(0, n, PAIR_SAMPLE), rng.integers(0, n, PAIR_SAMPLE)
    apart = np.abs(times[i] - times[j]) > PAIR_MIN_DIFFERENCE * np.minimum(times[i], times[j])
    i, j = i[apart], j[apart]
    if len(i) == 0:
        return float("nan")
    faster_first = np.sign(times[j] - times[i])  # +1 where i is faster
    agree = np.sign(scores[i] - scores[j]) * faster_first
    return float(np.mean((agree > 0) + 0.5 * (agree == 0)))


def evaluate_scores(
    scores: np.ndarray, times: np.ndarray, threshold: float = 0.05, seed: int = 0
) -> dict[str, float]:
    """Benchmarks to the first near-optimal candidate (exact over ties), top-1/top-5, pairwise."""
    order = _order(scores, seed)
    best = float(times.min())
    return {
        "benchmarks": expected_benchmarks_with_ties(scores, times, threshold),
        "top1": best / float(times[order[:1]].min()),
        "top5": best / float(times[order[:5]].min()),
        "pairwise": pairwise_accuracy(scores, times, seed),
    }


# ---- cross-validation --------------------------------------------------------------------------
def problem_folds(problems: Sequence[str], folds: int, seed: int) -> list[list[str]]:
    """Held-out problem sets: one per problem (folds <= 0 or >= #problems), else K groups."""
    if folds <= 0 or folds >= len(problems):
        return [[p] for p in problems]
    shuffled = list(np.random.default_rng(seed).permutation(np.array(problems, dtype=object)))
    return [list(chunk) for chunk in np.array_split(np.array(shuffled, dtype=object), folds)]


def cross_validate(
    data: TrainingData,
    kind: str,
    folds: int = 0,
    threshold: float = 0.05,
    seed: int = 0,
    n_jobs: int = 1,
    progress: bool = False,
) -> pd.DataFrame:
    """One row per held-out problem: N, k, random/heuristic/model benchmarks, top-k, pairwise."""
    rows = []
    splits = problem_folds(data.problems, folds, seed)
    for held_out in tqdm(splits, desc=f"cross-validating {kind}", disable=not progress):
        test = np.isin(data.groups, held_out)
        train = data.subset(~test)
        model = make_model(kind, seed=seed, n_jobs=n_jobs)
        model.fit(train.features, labels_from_times(train.times), train.groups)
        for problem in held_out:
            mask = data.groups == problem
            features, times = data.features[mask], data.times[mask]
            scores = model.predict(features)
            heuristic = HeuristicModel().predict(features)
            k = int(near_optimal(times, threshold).sum())
            learned = evaluate_scores(scores, times, threshold, seed)
            heur = evaluate_scores(heuristic, times, threshold, seed)
            rows.append({
                "problem": problem,
                "n": len(times),
                "k": k,
                "random": random_expected_benchmarks(len(times), k),
                "heuristic": heur["benchmarks"],
                "model": learned["benchmarks"],
                "top1": learned["top1"],
                "top5": learned["top5"],
                "pairwise": learned["pairwise"],
                "heuristic_top1": heur["top1"],
                "heuristic_pairwise": heur["pairwise"],
            })
    return pd.DataFrame(rows)


def summarise(cv: pd.DataFrame) -> dict[str, Any]:
    """Median / p90 of the benchmark counts and mean top-k / pairwise over held-out problems."""
    if cv.empty:
        return {}
    out: dict[str, Any] = {"held_out_problems": len(cv)}
    for column in ("model", "heuristic", "random"):
        out[f"{column}_median"] = float(np.median(cv[column]))
        out[f"{column}_p90"] = float(np.percentile(cv[column], 90))
    out["speedup_over_random_median"] = float(np.median(cv["random"] / cv["model"]))
    out["speedup_over_heuristic_median"] = float(np.median(cv["heuristic"] / cv["model"]))
    for column in ("top1", "top5", "pairwise", "heuristic_top1", "heuristic_pairwise"):
        out[f"{column}_mean"] = float(cv[column].mean())
    return out


# ---- report ------------------------------------------------------------------------------------
def report_markdown(
    kind: str,
    data: TrainingData,
    cv: pd.DataFrame,
    summary: dict[str, Any],
    importances: pd.Series,
    train_seconds: float,
    model_bytes: int,
    threshold: float,
    command: str,
    scheme: str,
) -> str:
    pct = f"{threshold:.0%}"
    lines = [
        f"# Cost model report: {kind}",
        "",
        f"Command: `{command}`",
        "",
        f"Training data: {len(data.times)} rows from {len(data.problems)} problems "
        f"({', '.join(sorted(set(data.sources.values())))}).",
        f"Final model: trained on all rows in {train_seconds:.2f} s, "
        f"file {model_bytes / 1e6:.2f} MB.",
        "",
        f"## Held-out problems ({scheme})",
        "",
    ]
    if cv.empty:
        lines.append("Cross-validation needs at least 2 problems; none was run.")
    else:
        lines += [
            f"Benchmarks until the first candidate within {pct} of the best (exact expectation "
            "over ties; random = (N+1)/(k+1)). top-1/top-5: best time / best time among the "
            "model's first 1/5 candidates (1 = found the best). pairwise: share of candidate pairs "
            "(times >1% apart) ordered correctly.",
            "",
            f"| problem | N | k within {pct} | random | heuristic | {kind} | top-1 | top-5 | "
            "pairwise |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in cv.itertuples():
            lines.append(
                f"| {r.problem} | {r.n} | {r.k} | {r.random:.1f} | {r.heuristic:.1f} | "
                f"{r.model:.1f} | {r.top1:.3f} | {r.top5:.3f} | {r.pairwise:.3f} |"
            )
        s = summary
        lines += [
            "",
            "| over held-out problems | random | heuristic | model |",
            "|---|---:|---:|---:|",
            f"| benchmarks to {pct}, median | {s['random_median']:.1f} | "
            f"{s['heuristic_median']:.1f} | {s['model_median']:.1f} |",
            f"| benchmarks to {pct}, p90 | {s['random_p90']:.1f} | {s['heuristic_p90']:.1f} | "
            f"{s['model_p90']:.1f} |",
            f"| top-1 score, mean | | {s['heuristic_top1_mean']:.3f} | {s['top1_mean']:.3f} |",
            f"| top-5 score, mean | | | {s['top5_mean']:.3f} |",
            f"| pairwise accuracy, mean | 0.5 | {s['heuristic_pairwise_mean']:.3f} | "
            f"{s['pairwise_mean']:.3f} |",
            "",
            f"Median speedup over random: {s['speedup_over_random_median']:.1f}x; over the "
            f"heuristic: {s['speedup_over_heuristic_median']:.2f}x.",
        ]
    lines += ["", "## Feature importances (final model, top 10)", "",
              "| feature | share |", "|---|---:|"]
    lines += [f"| `{name}` | {share:.3f} |" for name, share in importances.head(10).items()]
    return "\n".join(lines) + "\n"


def report_plot(cv: pd.DataFrame, importances: pd.Series, kind: str, threshold: float,
                path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, imp) = plt.subplots(1, 2, figsize=(13, max(3.5, 0.5 * len(cv) + 2)))
    if not cv.empty:
        y = np.arange(len(cv))
        for offset, column in ((-0.27, "random"), (0.0, "heuristic"), (0.27, "model")):
            label = kind if column == "model" else column
            bars.barh(y + offset, cv[column], height=0.27, label=label)
        bars.set_yticks(y, [str(p)[:45] for p in cv["problem"]], fontsize=7)
        bars.set_xscale("log")
        bars.invert_yaxis()
        bars.legend(fontsize=8)
    bars.set_xlabel(f"benchmarks until within {threshold:.0%} of the best (held out, log)")
    top = importances.head(15)[::-1]
    imp.barh(np.arange(len(top)), top.to_numpy())
    imp.set_yticks(np.arange(len(top)), list(top.index), fontsize=7)
    imp.set_xlabel("feature importance share (final model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_paths(output: Path) -> tuple[Path, Path]:
    stem = output.with_suffix("") if output.suffix == ".json" else output
    return Path(f"{stem}.report.md"), Path(f"{stem}.report.png")


# ---- command line ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="train-costmodel",
        description="Train a learned cost model on measured spaces, cross-validate it with whole "
        "problems held out, and save it (safe JSON model file) with a report.",
    )
    parser.add_argument("inputs", nargs="+", metavar="LOGS_OR_DATASETS",
                        help="results.jsonl(.gz) files, tune output dirs (or dirs of them), "
                        "Kernel Tuner caches (.json/.json.gz), shipped:cpu_host (the shipped CPU "
                        "dataset)")
    parser.add_argument("--model", choices=tuple(MODELS), default="gbm", help="default gbm")
    parser.add_argument("--output", "-o", type=Path, required=True,
                        help="model file to write (JSON); the report goes next to it")
    parser.add_argument("--folds", type=int, default=0,
                        help="held-out problem groups (default 0 = leave one problem out)")
    parser.add_argument("--threshold", type=float, default=0.05,
                        help="near-optimal threshold (0.05 = within 5%% of the best)")
    parser.add_argument("--time", choices=("min", "median"), default="min",
                        help="time of a logged candidate from its repetitions (default min, the "
                        "tuning loop's estimator)")
    parser.add_argument("--seed", type=int, default=0, help="model seed and tie-break seed")
    parser.add_argument("--n-jobs", type=int, default=1,
                        help="threads for training (default 1; at most 2 on a shared machine)")
    parser.add_argument("--no-cv", action="store_true", help="train only, skip cross-validation")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG plot")
    return parser


def run(args: argparse.Namespace) -> int:
    if not 0 < args.threshold < 1:
        raise InputError("--threshold must be in (0, 1)")
    if args.n_jobs < 1:
        raise InputError("--n-jobs must be >= 1")
    output: Path = args.output
    if output.exists() and output.is_dir():
        raise InputError(f"--output {output} is a directory; give a file path such as model.json")
    progress = sys.stderr.isatty()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = load_training_data(args.inputs, f"{args.time}_ms", progress)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    print(f"training data: {len(data.times)} rows, {len(data.problems)} problems", file=sys.stderr)

    scheme = ("leave one problem out" if args.folds <= 0 or args.folds >= len(data.problems)
              else f"{args.folds} folds of whole problems")
    cv = pd.DataFrame()
    if not args.no_cv and len(data.problems) >= 2:
        cv = cross_validate(data, args.model, args.folds, args.threshold, args.seed, args.n_jobs,
                            progress)
    elif not args.no_cv:
        print("warning: one problem only: cross-validation needs at least 2; skipped",
              file=sys.stderr)
    summary = summarise(cv)

    model: LearnedModel = make_model(args.model, seed=args.seed, n_jobs=args.n_jobs)
    start = time.perf_counter()
    model.fit(data.features, labels_from_times(data.times), data.groups)
    train_seconds = time.perf_counter() - start

    from dispatchtune.costmodel.modelfile import save_model

    command = "train-costmodel " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    metadata = {
        "training_data": data.summary(),
        "cross_validation": {
            "scheme": scheme if not cv.empty else "none",
            "threshold": args.threshold,
            **summary,
            "per_problem": cv.to_dict(orient="records"),
        },
        "training_seconds": round(train_seconds, 3),
        "time_estimator": args.time,
        "command": command,
    }
    save_model(model, output, metadata)
    size = output.stat().st_size
    importances = model.feature_importances()
    text = report_markdown(args.model, data, cv, summary, importances, train_seconds, size,
                           args.threshold, command, scheme)
    report, plot = report_paths(output)
    report.write_text(text, encoding="utf-8")
    print(text)
    print(f"model written to {output} ({size / 1e6:.2f} MB); report {report}", file=sys.stderr)
    if not args.no_plot:
        report_plot(cv, importances, args.model, args.threshold, plot)
        print(f"plot written to {plot}", file=sys.stderr)
    return 0
