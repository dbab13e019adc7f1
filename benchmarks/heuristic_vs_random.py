"""Heuristic order vs random order on real measurements: benchmarks to the first near-optimal candidate.

For every measured space (a Kernel Tuner GEMM cache, or one problem of a dispatchtune
`results.jsonl` log), with N valid candidates of which k are within the threshold of the best:

- random: the exact expectation (N + 1) / (k + 1) of a uniformly random order;
- heuristic: the position of the first near-optimal candidate in the order `rank` returns (ties
  broken by its seeded draw, seed 0), and the exact expectation over all tie-breaks (equal
  scores shuffled), which is the headline figure: ties can neither flatter nor hurt it.

Usage:
  python benchmarks/heuristic_vs_random.py \
      --kerneltuner ../shared/data/kerneltuner/gemm_*.json.gz \
      --results tune_out/*/results.jsonl --markdown evidence.md --plot evidence.png
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dispatchtune.costmodel.heuristic import HeuristicModel
from dispatchtune.costmodel.metrics import (
    benchmarks_to_near_optimal,
    expected_benchmarks_with_ties,
    near_optimal,
    random_expected_benchmarks,
)
from dispatchtune.costmodel.order import order_by_score
from dispatchtune.errors import DispatchTuneError

SIDE_THRESHOLDS = (0.02, 0.10)


@dataclass
class Space:
    """One measured space: its label, feature table and valid times (aligned rows)."""

    source: str
    label: str
    features: pd.DataFrame
    times: np.ndarray


@dataclass
class Row:
    source: str
    label: str
    n: int
    k: int
    random: float
    heuristic: float
    heuristic_ties: float
    side: dict[float, tuple[float, float]]

    @property
    def speedup(self) -> float:
        return self.random / self.heuristic_ties


def load(paths: Sequence[str]) -> list[Space]:
    """The measured spaces of Kernel Tuner caches and results logs (`datasets.spaces`), with a
    candidate's time the median of its repetitions; caches without a feature mapping are skipped."""
    from dispatchtune.datasets.spaces import KERNELTUNER, load_spaces
    from dispatchtune.features.spaces import has_features, space_features
    from dispatchtune.problem import Problem

    spaces = []
    for space in load_spaces(paths, "median_ms", progress=sys.stderr.isatty()):
        if not has_features(space):
            print(f"skipped {space.source}: {space.label!r} is not a GEMM space", file=sys.stderr)
            continue
        if space.kind == KERNELTUNER:
            spaces.append(Space("Kernel Tuner", space.label, space_features(space), space.times))
            continue
        problem = space.problem
        assert isinstance(problem, Problem)
        loops = "x".join(str(size) for size in problem.loop_sizes)
        label = f"{space.device} {problem.kind} {loops} {'x'.join(problem.input_types)}"
        table = space.table
        orders = set(table["order"].dropna().astype(str)) if "order" in table else set()
        if "heuristic" in orders:
            # A budgeted run in heuristic order measured the heuristic's own favourites: unless
            # it covered the whole space, comparing on it flatters the heuristic.
            print(f"warning: {label}: benchmarked in heuristic order; the comparison is only fair "
                  "if the whole space was measured (collect evidence with --order random)",
                  file=sys.stderr)
            label += " [heuristic-ordered log]"
        spaces.append(Space("IREE results.jsonl", label, space_features(space), space.times))
    return spaces


def evaluate(space: Space, threshold: float) -> Row:
    scores = HeuristicModel().predict(space.features)
    order = order_by_score(scores, seed=0)
    n = len(space.times)

    def pair(th: float) -> tuple[float, float]:
        k = int(near_optimal(space.times, th).sum())
        return random_expected_benchmarks(n, k), expected_benchmarks_with_ties(
            scores, space.times, th)

    k = int(near_optimal(space.times, threshold).sum())
    return Row(
        source=space.source,
        label=space.label,
        n=n,
        k=k,
        random=random_expected_benchmarks(n, k),
        heuristic=float(benchmarks_to_near_optimal(space.times[order], threshold)),
        heuristic_ties=expected_benchmarks_with_ties(scores, space.times, threshold),
        side={th: pair(th) for th in SIDE_THRESHOLDS},
    )


def markdown(rows: Sequence[Row], threshold: float) -> str:
    pct = f"{threshold:.0%}"
    side = " | ".join(f"{th:.0%}: random / heuristic" for th in SIDE_THRESHOLDS)
    lines = [
        f"| source | problem | N valid | k within {pct} | random (N+1)/(k+1) | heuristic "
        f"(rank, seed 0) | heuristic (ties shuffled, exact) | speedup over random | {side} |",
        "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(SIDE_THRESHOLDS),
    ]
    for r in rows:
        extra = " | ".join(f"{r.side[th][0]:.1f} / {r.side[th][1]:.1f}" for th in SIDE_THRESHOLDS)
        lines.append(
            f"| {r.source} | {r.label} | {r.n} | {r.k} | {r.random:.1f} | {r.heuristic:.0f} | "
            f"{r.heuristic_ties:.1f} | {r.speedup:.1f}x | {extra} |"
        )
    if rows:
        speedups = np.array([r.speedup for r in rows])
        wins = int((speedups > 1).sum())
        lines.append("")
        lines.append(
            f"Speedup over random at {pct} (random expectation / heuristic expectation): "
            f"median {np.median(speedups):.2f}x, geometric mean "
            f"{np.exp(np.log(speedups).mean()):.2f}x, heuristic better on {wins} of {len(rows)}."
        )
    return "\n".join(lines)


def plot(rows: Sequence[Row], spaces: Sequence[Space], path: Path, threshold: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, curves) = plt.subplots(1, 2, figsize=(14, max(4.0, 0.45 * len(rows) + 2)))
    y = np.arange(len(rows))
    bars.barh(y - 0.2, [r.random for r in rows], height=0.4, label="random (N+1)/(k+1)")
    bars.barh(y + 0.2, [r.heuristic_ties for r in rows], height=0.4, label="heuristic")
    bars.set_yticks(y, [r.label[:48] for r in rows], fontsize=7)
    bars.set_xscale("log")
    bars.invert_yaxis()
    bars.set_xlabel(f"benchmarks until a candidate within {threshold:.0%} of the best (log)")
    bars.legend(fontsize=8)
    rng = np.random.default_rng(0)
    for space in spaces:
        order = order_by_score(HeuristicModel().predict(space.features), seed=0)
        best = space.times.min()
        steps = np.arange(1, len(space.times) + 1)
        heur = best / np.minimum.accumulate(space.times[order])
        line = curves.plot(steps, heur, label=f"heuristic: {space.label[:40]}")[0]
        rand = np.mean([best / np.minimum.accumulate(space.times[rng.permutation(len(steps))])
                        for _ in range(50)], axis=0)
        curves.plot(steps, rand, linestyle="--", color=line.get_color())
    curves.set_xscale("log")
    curves.set_xlabel("benchmarks (log); dashed: mean of 50 random orders")
    curves.set_ylabel("best so far / best of the space")
    curves.axhline(1 / (1 + threshold), color="grey", linewidth=0.5)
    curves.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kerneltuner", nargs="*", default=[], metavar="PATH",
                        help="Kernel Tuner cache files (.json or .json.gz); GEMM spaces are used")
    parser.add_argument("--results", nargs="*", default=[], metavar="PATH",
                        help="dispatchtune results.jsonl files or tune output directories")
    parser.add_argument("--threshold", type=float, default=0.05,
                        help="near-optimal threshold (0.05 = within 5%% of the best)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")
    args = parser.parse_args(argv)
    if not args.kerneltuner and not args.results:
        parser.error("give --kerneltuner and/or --results paths")
    try:
        spaces = load([*args.kerneltuner, *args.results])
        rows = [evaluate(space, args.threshold) for space in spaces]
    except DispatchTuneError as exc:
        print(f"heuristic_vs_random: error: {exc}", file=sys.stderr)
        return 2
    table = markdown(rows, args.threshold)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.plot and rows:
        plot(rows, spaces, args.plot, args.threshold)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
