"""`train-costmodel INPUTS... --model gbm|rf|lambdarank --output PATH`: train, cross-validate, save.

Inputs are measured spaces: dispatchtune `results.jsonl` logs (a file, a tune output directory, or
a directory of such directories, e.g. the output of `datasets/collect_cpu.py`) and Kernel Tuner
cache files (`.json` / `.json.gz`; GEMM spaces), loaded by `datasets.spaces.load_spaces`: each
measured space (a (problem, target, CPU) of a log, a cache) is one *problem*; labels are
normalised per problem (`costmodel.learned`).

Cross-validation holds whole problems out (leave-one-problem-out, or `--folds K` groups of
problems; a workload measured on several devices, say one matmul on an AVX2 and an AVX-512 CPU,
is held out on all of them at once): the model is trained on the other problems and judged on
the held-out ones by the benchmarks it needs until the first candidate within 5% of the best
(exact expectation over ties, `expected_benchmarks_with_ties`), next to the exact random
expectation (N+1)/(k+1) and the handwritten heuristic on the same rows. Then the model is
trained on everything and saved (`costmodel.modelfile`) with the report in its metadata; the
report is printed and written to `<output stem>.report.md` with a plot `<output stem>.report.png`
(for `--output m.json`: `m.report.md`, `m.report.png`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from dispatchtune.costmodel.heuristic import HeuristicModel
from dispatchtune.costmodel.learned import labels_from_times, make_model
from dispatchtune.costmodel.metrics import (
    expected_benchmarks_with_ties,
    near_optimal,
    random_expected_benchmarks,
)
from dispatchtune.costmodel.order import order_by_score
from dispatchtune.datasets.spaces import load_spaces
from dispatchtune.errors import InputError
from dispatchtune.features.extract import FEATURE_NAMES
from dispatchtune.features.spaces import has_features, space_features

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
    #: problem label -> its workload (`MeasuredSpace.workload`; absent: the label itself)
    workloads: dict[str, str] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        return list(dict.fromkeys(self.groups.tolist()))

    def subset(self, mask: np.ndarray) -> TrainingData:
        return TrainingData(self.features[mask].reset_index(drop=True), self.times[mask],
                            self.groups[mask], self.sources, self.workloads)

    def held_out_sets(self, folds: int, seed: int) -> list[list[str]]:
        """The problems each cross-validation fit leaves out: `problem_folds` over workloads,
        each workload's problems (one per device it was measured on) together."""
        workload = {p: self.workloads.get(p, p) for p in self.problems}
        names = list(dict.fromkeys(workload.values()))
        return [[p for p in self.problems if workload[p] in chosen]
                for chosen in map(set, problem_folds(names, folds, seed))]

    def summary(self) -> dict[str, Any]:
        counts = pd.Series(self.groups).value_counts(sort=False)
        return {
            "rows": len(self.times),
            "problems": len(counts),
            "per_problem": {str(k): int(v) for k, v in counts.items()},
            "sources": sorted(set(self.sources.values())),
        }


def load_training_data(
    paths: Sequence[str | Path], time_column: str = "min_ms", progress: bool = False
) -> TrainingData:
    """Feature rows, times and problem labels of every measured space in `paths`.

    The spaces are `datasets.spaces.load_spaces`'s (valid rows only, a candidate measured in
    several sessions once, with its median over sessions of `time_column`: `min_ms` = the tuning
    loop's default estimator, or `median_ms`; problems with fewer than 2 valid rows dropped).
    Spaces the feature vocabulary does not cover (non-GEMM Kernel Tuner caches) are skipped with
    a warning.
    """
    spaces = []
    for space in load_spaces(paths, time_column, progress):
        if has_features(space):
            spaces.append(space)
        else:
            warnings.warn(f"{space.source}: {space.label!r} is not a GEMM space; skipped",
                          stacklevel=2)
    if not spaces:
        raise InputError("no measured problem with at least 2 valid candidates and a feature "
                         "mapping in the inputs")
    return TrainingData(
        features=pd.concat([space_features(s) for s in spaces],
                           ignore_index=True)[list(FEATURE_NAMES)],
        times=np.concatenate([s.times for s in spaces]),
        groups=np.concatenate([np.full(s.n, s.label, dtype=object) for s in spaces]),
        sources={s.label: s.source for s in spaces},
        workloads={s.label: s.workload for s in spaces},
    )


# ---- metrics of one held-out problem ----------------------------------------------------------
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
    order = order_by_score(scores, seed)  # the order `rank` produces
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
    splits = data.held_out_sets(folds, seed)
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
