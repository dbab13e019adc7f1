"""All peers side by side on the Kernel Tuner spaces, in one run.

On each fully measured Kernel Tuner space (default: the two GEMM caches and the convolution cache
in ../shared/data/kerneltuner), every method is counted the same way: benchmarks until the first
configuration within the threshold (5%) of the space's best, over `--seeds` seeds per stochastic
method, with failed configurations costing a benchmark:

- dispatchtune's orders and the other peers (random, heuristic, learned static order, online,
  Optuna TPE) from the evaluation harness (`dispatchtune.evaluation.harness.replay_rows`);
- Kernel Tuner's own strategies (genetic algorithm, dual annealing, particle swarm, Bayesian
  optimisation) replayed in its simulation mode (`dispatchtune.benchmarks.kerneltuner_peers`).

`bayes_opt` costs about 0.1 s of Gaussian-process work per benchmark here (minutes per run), so
its runs end at their first near-optimal configuration: its count to the threshold is the full
run's, but its `evaluated` and best-so-far curve stop there (`--full-bayes-opt` runs it to the
budget). Kernel Tuner (the `bench` extra) is needed only by this script.

Writes report.md, results.csv and plots into --output-dir (`harness.write_report`) and prints a
summary table. The Kernel Tuner rows are checkpointed run by run in kerneltuner_rows.csv, the
harness's order by order in harness_rows.csv: a rerun with the same settings replays only what they
lack. On two cores, run the parts side by side, then once more for the report:

  .venv/bin/python benchmarks/peers.py --output-dir peers_out --orders &      # Kernel Tuner only
  .venv/bin/python benchmarks/peers.py --output-dir peers_out --strategies &  # harness only
  wait; .venv/bin/python benchmarks/peers.py --output-dir peers_out           # both, from checkpoints

Usage:
  .venv/bin/python benchmarks/peers.py --output-dir peers_out [--seeds 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.evaluation.harness import EVALUATION_ORDERS

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "kerneltuner"
SPACES = ("gemm_RTX_2080_Ti.json.gz", "gemm_RTX_Titan.json.gz", "convolution_A4000.json.gz")


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (problem, order): runs, hit rate and the medians, a missed run counting as never."""
    out = []
    for (problem, order), group in rows.groupby(["problem", "order"], sort=False):
        b2t = group["benchmarks_to_threshold"].to_numpy(dtype=np.float64)
        hits = b2t[np.isfinite(b2t)]
        # A miss (never within the threshold: the budget ran out, or the strategy stopped first)
        # sorts last, so the median is honest while at least half the runs hit, and is "miss"
        # otherwise.
        median_all = float(np.median(np.where(np.isfinite(b2t), b2t, np.inf)))
        out.append({
            "problem": problem,
            "order": order,
            "runs": len(group),
            "hit_rate": hits.size / len(group),
            "median": f"{median_all:.1f}" if np.isfinite(median_all) else "miss",
            "median_of_hits": float(np.median(hits)) if hits.size else float("nan"),
            "random_expected": float(group["random_expected"].iloc[0]),
            "median_invalid": float(np.median(group["invalid_proposals"])),
            "median_evaluated": float(np.median(group["evaluated"])),
        })
    return pd.DataFrame(out)


def markdown_table(frame: pd.DataFrame) -> str:
    def cell(value: object) -> str:
        if isinstance(value, float):
            return "-" if np.isnan(value) else f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}"
        return str(value)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def kernel_tuner_part(
    spaces: Sequence[Path], strategies: Sequence[str], seeds: Sequence[int], threshold: float,
    max_benchmarks: int, out_dir: Path, full_bayes_opt: bool,
) -> pd.DataFrame:
    """Kernel Tuner's rows, checkpointed run by run in out_dir/kerneltuner_rows.csv.

    A rerun with the same settings replays only the runs the checkpoint lacks (bayes_opt alone
    takes most of an hour on two shared cores); other settings start it afresh.
    """
    from dispatchtune.benchmarks.kerneltuner_peers import COLUMNS, kernel_tuner_rows, typed_rows
    from dispatchtune.datasets.kerneltuner import load_kerneltuner

    # The same for every subset of strategies, so runs of some strategies share one checkpoint.
    stop = [] if full_bayes_opt else ["bayes_opt"]
    settings = {"threshold": threshold, "max_benchmarks": max_benchmarks, "stop_at_hit": stop}
    checkpoint, meta = out_dir / "kerneltuner_rows.csv", out_dir / "kerneltuner_rows.json"
    done = pd.DataFrame(columns=list(COLUMNS))
    if checkpoint.is_file() and meta.is_file() and json.loads(meta.read_text()) == settings:
        done = pd.read_csv(checkpoint)
    else:
        meta.write_text(json.dumps(settings))
        done.to_csv(checkpoint, index=False)

    def save(row: dict[str, object]) -> None:
        pd.DataFrame([row], columns=list(COLUMNS)).to_csv(checkpoint, mode="a", header=False, index=False)

    have = set(zip(done["problem"], done["order"], done["seed"], strict=True))
    parts = [typed_rows(done)] if len(done) else []
    # Strategy by strategy across the spaces: the cheap ones are complete long before bayes_opt.
    for strategy in strategies:
        for space in spaces:
            name = load_kerneltuner(space).label()
            todo = [s for s in seeds if (name, f"kt_{strategy}", s) not in have]
            if todo:
                parts.append(kernel_tuner_rows(space, [strategy], todo, threshold=threshold,
                                               max_fevals=max_benchmarks, stop_at_hit=stop, on_row=save))
    rows = pd.concat(parts, ignore_index=True) if parts else typed_rows(done)
    wanted = rows["order"].isin([f"kt_{s}" for s in strategies]) & rows["seed"].isin(list(seeds))
    return rows[wanted].drop_duplicates(["problem", "order", "seed"]).reset_index(drop=True)


def harness_part(
    spaces: Sequence[Path], orders: Sequence[str], seeds: Sequence[int], threshold: float,
    max_benchmarks: int, out_dir: Path,
) -> pd.DataFrame:
    """The evaluation harness's rows, checkpointed order by order in out_dir/harness_rows.csv.

    An order whose rows cover every space and seed is read back, not replayed, so the harness and
    Kernel Tuner parts can run as two processes on one output directory (`--strategies` with no
    names, and `--orders` with none) and a last full run only writes the report. The checkpoint is
    keyed on the settings, not on the code: delete it after changing an order.
    """
    from dispatchtune.benchmarks.kerneltuner_peers import typed_rows
    from dispatchtune.evaluation import harness

    settings = {"threshold": threshold, "max_benchmarks": max_benchmarks,
                "spaces": sorted(p.name for p in spaces)}
    checkpoint, meta = out_dir / "harness_rows.csv", out_dir / "harness_rows.json"
    done = pd.DataFrame(columns=list(harness.COLUMNS))
    if checkpoint.is_file() and meta.is_file() and json.loads(meta.read_text()) == settings:
        done = typed_rows(pd.read_csv(checkpoint))
    else:
        meta.write_text(json.dumps(settings))
        done.to_csv(checkpoint, index=False)
    loaded = harness.load_replay_spaces(list(spaces))
    parts = [done] if len(done) else []
    for order in orders:
        have = done[done["order"] == order]
        # Orders that do not apply to a space (no features, nothing to learn from) have no rows
        # there, so "complete" is every seed for every space the order produced rows on, or a
        # previous attempt that produced none at all is retried.
        complete = len(have) and all(set(seeds) <= set(g["seed"]) for _, g in have.groupby("problem"))
        if complete:
            continue
        rows = harness.replay_spaces(loaded, [order], list(seeds), threshold=threshold,
                                     max_benchmarks=max_benchmarks)
        rows.to_csv(checkpoint, mode="a", header=False, index=False)
        parts.append(rows)
    rows = pd.concat(parts, ignore_index=True) if parts else done
    wanted = rows["order"].isin(list(orders)) & rows["seed"].isin(list(seeds))
    return rows[wanted].drop_duplicates(["problem", "order", "seed"], keep="last").reset_index(drop=True)


def run(
    spaces: Sequence[Path], orders: Sequence[str], strategies: Sequence[str], seeds: Sequence[int],
    threshold: float, max_benchmarks: int, out_dir: Path, full_bayes_opt: bool, command: str = "",
) -> tuple[pd.DataFrame, Path, dict[str, float]]:
    """Every peer's rows on every space; writes the report; returns (rows, report, seconds per part)."""
    missing = [str(p) for p in spaces if not p.is_file()]
    if missing:
        raise InputError(f"Kernel Tuner cache not found: {missing[0]}")
    if not orders and not strategies:
        raise InputError("nothing to compare: give --orders and/or --strategies")
    out_dir.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    parts = []
    if strategies:
        start = time.perf_counter()
        parts.append(kernel_tuner_part(spaces, strategies, seeds, threshold, max_benchmarks, out_dir,
                                       full_bayes_opt))
        seconds["kernel_tuner"] = time.perf_counter() - start
    try:
        from dispatchtune.evaluation import harness
    except ImportError as exc:
        raise DispatchTuneError(f"evaluation harness not available ({exc}); Kernel Tuner rows kept in "
                                f"{out_dir / 'kerneltuner_rows.csv'}") from exc
    if orders:
        start = time.perf_counter()
        parts.append(harness_part(spaces, orders, seeds, threshold, max_benchmarks, out_dir))
        seconds["harness"] = time.perf_counter() - start
    rows = pd.concat(parts, ignore_index=True)
    title = (f"Peers on Kernel Tuner spaces: benchmarks to {threshold:.0%} of the best, "
             f"{len(seeds)} seeds, budget {max_benchmarks}")
    report = harness.write_report(rows, out_dir, threshold, title, max_benchmarks=max_benchmarks,
                                  command=command)
    return rows, report, seconds


def main(argv: Sequence[str] | None = None) -> int:
    from dispatchtune.benchmarks.kerneltuner_peers import STRATEGIES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1 per stochastic method")
    parser.add_argument("--threshold", type=float, default=0.05)
    parser.add_argument("--max-benchmarks", type=int, default=1000)
    parser.add_argument("--spaces", type=Path, nargs="+",
                        default=[DATA_DIR / name for name in SPACES], metavar="CACHE")
    parser.add_argument("--orders", nargs="*", default=list(EVALUATION_ORDERS),
                        help="evaluation-harness orders (none: Kernel Tuner's strategies only)")
    parser.add_argument("--strategies", nargs="*", default=list(STRATEGIES),
                        help="Kernel Tuner strategies")
    parser.add_argument("--full-bayes-opt", action="store_true",
                        help="run bayes_opt to the budget instead of ending it at its first hit (slow)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.max_benchmarks < 1:
        parser.error("--seeds and --max-benchmarks must be >= 1")
    start = time.perf_counter()
    try:
        rows, report, seconds = run(args.spaces, args.orders, args.strategies, list(range(args.seeds)),
                           args.threshold, args.max_benchmarks, args.output_dir, args.full_bayes_opt,
                           command=" ".join(["python", "benchmarks/peers.py", *sys.argv[1:]]))
    except DispatchTuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - start
    parts = ", ".join(f"{name} {sec:.0f} s" for name, sec in seconds.items())
    table = markdown_table(summarize(rows))
    footer = f"{len(rows)} runs in {wall:.0f} s wall ({parts}); report: {report}"
    (args.output_dir / "peers_summary.md").write_text(
        "Hit rate: share of runs that reached the threshold at all; median: a miss counts as never.\n\n"
        f"{table}\n\n{footer}\n")
    print(f"{table}\n\n{footer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
