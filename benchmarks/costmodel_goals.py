"""Measured figures for the learned cost models' goals (issue #6, item 6).

For each model (rf, gbm, lambdarank) this prints:

1. model file size (trained on all given spaces, saved with `save_model`; goal < 5 MB);
2. training time on `--rows` rows (default 100,000; goal < 60 s on 2 cores). The rows are real
   feature rows of the given spaces stacked until there are enough; each stacked copy is its own
   problem and gets a tiny multiplicative jitter (1 + 1e-4 N(0,1)) on its non-flag features and
   times, so that the 100k rows are distinct and duplicate merging cannot shrink the work (the
   worst case). Measured with `--n-jobs` threads (default 2);
3. time to rank 10,000 candidates with the model loaded from its file (`load_model` then
   `rank(features)`: predict + sort; median of 7; goal < 100 ms);
4. held-out quality: leave-one-problem-out over the given spaces, benchmarks until the first
   candidate within 5% of the best (exact expectation), median over held-out problems, next to the
   exact random expectation and the heuristic (goal: >= 5x fewer than random, fewer than the
   heuristic).

Usage:
  python benchmarks/costmodel_goals.py \
      --kerneltuner ../shared/data/kerneltuner/gemm_RTX_2080_Ti.json.gz \
                    ../shared/data/kerneltuner/gemm_RTX_Titan.json.gz \
      [--results tune_out_dir ...] [--models gbm rf lambdarank] [--rows 100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dispatchtune.costmodel.learned import MODELS, labels_from_times, make_model
from dispatchtune.costmodel.modelfile import load_model, save_model
from dispatchtune.costmodel.train import (
    TrainingData,
    cross_validate,
    load_training_data,
    summarise,
)
from dispatchtune.errors import DispatchTuneError

FLAG_FEATURES = ("is_gpu", "kind_contraction", "kind_convolution", "kind_attention")


def synthetic_rows(data: TrainingData, rows: int, seed: int = 0) -> TrainingData:
    """`rows` rows made of stacked real rows; each copy a problem of its own, jittered (see doc)."""
    rng = np.random.default_rng(seed)
    copies = -(-rows // len(data.times))
    index = np.tile(np.arange(len(data.times)), copies)[:rows]
    copy = np.repeat(np.arange(copies), len(data.times))[:rows]
    features = data.features.iloc[index].reset_index(drop=True).copy()
    jitter_cols = [c for c in features.columns if c not in FLAG_FEATURES]
    features[jitter_cols] *= 1 + 1e-4 * rng.standard_normal((rows, len(jitter_cols)))
    times = data.times[index] * (1 + 1e-4 * rng.standard_normal(rows))
    groups = np.array([f"{g} #{c}" for g, c in zip(data.groups[index], copy, strict=True)],
                      dtype=object)
    return TrainingData(features, np.abs(times), groups, data.sources)


def ten_thousand(data: TrainingData) -> pd.DataFrame:
    """10,000 real candidate feature rows (the first space's, repeated if it is smaller)."""
    first = data.features[data.groups == data.problems[0]]
    reps = -(-10_000 // len(first))
    return pd.concat([first] * reps, ignore_index=True).head(10_000)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kerneltuner", nargs="*", default=[], metavar="PATH")
    parser.add_argument("--results", nargs="*", default=[], metavar="PATH",
                        help="results.jsonl files or tune output directories (or dirs of them)")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=tuple(MODELS))
    parser.add_argument("--rows", type=int, default=100_000, help="rows for the training timing")
    parser.add_argument("--n-jobs", type=int, default=2, help="threads for the training timing")
    parser.add_argument("--threshold", type=float, default=0.05)
    args = parser.parse_args(argv)
    if not args.kerneltuner and not args.results:
        parser.error("give --kerneltuner and/or --results paths")
    try:
        data = load_training_data([*args.kerneltuner, *args.results])
    except DispatchTuneError as exc:
        print(f"costmodel_goals: error: {exc}", file=sys.stderr)
        return 2
    print(f"data: {len(data.times)} rows, {len(data.problems)} problems; machine: "
          f"{os.cpu_count()} cores (shared; timings are noisy)\n")
    big = synthetic_rows(data, args.rows)
    candidates = ten_thousand(data)
    lines = [
        f"| model | file size (goal < 5 MB) | train {args.rows} distinct rows, {args.n_jobs} "
        "threads (goal < 60 s) | rank 10k candidates, loaded model (goal < 100 ms) | held-out "
        f"benchmarks to {args.threshold:.0%}: model / heuristic / random, median (p90) | "
        "x fewer than random |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for kind in args.models:
        model = make_model(kind, n_jobs=1)
        model.fit(data.features, labels_from_times(data.times), data.groups)
        with tempfile.TemporaryDirectory() as tmp:
            path = save_model(model, Path(tmp) / f"{kind}.json")
            size = path.stat().st_size
            loaded = load_model(path)
        loaded.rank(candidates)  # warm-up (imports, first-call allocations)
        timings = []
        for _ in range(7):
            start = time.perf_counter()
            loaded.rank(candidates)
            timings.append(time.perf_counter() - start)
        rank_ms = 1000 * statistics.median(timings)

        start = time.perf_counter()
        make_model(kind, n_jobs=args.n_jobs).fit(big.features, labels_from_times(big.times),
                                                 big.groups)
        train_s = time.perf_counter() - start

        if len(data.problems) >= 2:
            s = summarise(cross_validate(data, kind, threshold=args.threshold))
            held = (f"{s['model_median']:.1f} ({s['model_p90']:.1f}) / "
                    f"{s['heuristic_median']:.1f} ({s['heuristic_p90']:.1f}) / "
                    f"{s['random_median']:.1f} ({s['random_p90']:.1f})")
            fewer = f"{s['speedup_over_random_median']:.0f}x"
        else:
            held, fewer = "needs >= 2 problems", "-"
        lines.append(f"| {kind} | {size / 1e6:.2f} MB | {train_s:.1f} s | {rank_ms:.0f} ms | "
                     f"{held} | {fewer} |")
        print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
