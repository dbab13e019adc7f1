"""The development suite: every method on every Kernel Tuner space, each space reported on its own.

On each fully measured space (default: every cache in ../shared/data/kerneltuner), a method is
scored by the benchmarks it needs to reach the first configuration within 5% of the space's best,
over seeded runs; anything learned is trained on the other spaces only (leave one space out):

- peers: random (its exact expectation (N+1)/(k+1)), the handwritten heuristic (GEMM spaces; the
  knob heuristic elsewhere), the knob heuristic everywhere, the gbm static order (where features
  exist), Optuna TPE over the raw knobs and Kernel Tuner's genetic algorithm, dual annealing,
  particle swarm and Bayesian optimisation (replayed in its simulation mode);
- ours: the online search (`search.online.OnlineSearch`).

Peers do not depend on dispatchtune's search, so they are computed once and checkpointed in
--output-dir (Kernel Tuner run by run, as in `benchmarks/peers.py`; each harness order in its own
file keyed on its seeds and budget); `--fresh online` replays the online search again after a change.
TPE (about a minute per run of 1,000 trials on two shared cores) takes `--tpe-seeds` seeds and a
`--tpe-budget` benchmark cap (a run that misses within the cap counts as a miss), and Kernel Tuner's
Bayesian optimisation (up to minutes per run) `--bo-seeds` seeds; both run after the others.

Prints, per space: each method's median (a miss counts as never: "miss" when fewer than half the
runs hit), hit rates within 50 and 200, and the online search's ratio to the best peer; writes
suite_summary.md, report.md, runs and the best-so-far plot into --output-dir.

  .venv/bin/python benchmarks/suite.py --output-dir suite_out --seeds 20            # everything
  .venv/bin/python benchmarks/suite.py --output-dir suite_out --fresh online        # after a change
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

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "kerneltuner"
#: Harness orders that are peers, and ours.
PEER_ORDERS = ("random", "heuristic", "knobs", "gbm", "tpe")
OURS = ("online",)
HITS = (50, 200)


def harness_rows(
    spaces: Sequence[Path], order: str, seeds: Sequence[int], max_benchmarks: int, out_dir: Path,
    fresh: bool = False,
) -> pd.DataFrame:
    """One harness order on every space, checkpointed space by space in harness_<order>.csv.

    The checkpoint is keyed on the benchmark cap; seeds it lacks are replayed and appended, so
    asking for more seeds (TPE: 5 -> 20) reuses the runs already made.
    """
    from dispatchtune.benchmarks.kerneltuner_peers import typed_rows
    from dispatchtune.evaluation import harness

    checkpoint, meta = out_dir / f"harness_{order}.csv", out_dir / f"harness_{order}.json"
    done = pd.DataFrame(columns=list(harness.COLUMNS))
    stored = json.loads(meta.read_text()) if meta.is_file() else {}
    if not fresh and checkpoint.is_file() and stored.get("max_benchmarks") == max_benchmarks:
        done = typed_rows(pd.read_csv(checkpoint))
    else:
        done.to_csv(checkpoint, index=False)
    seen = {int(s) for s in done["seed"] if s >= 0}
    meta.write_text(json.dumps({"seeds": sorted(seen | set(seeds)), "max_benchmarks": max_benchmarks}))
    parts = [done]
    # Leave-one-space-out training needs every space loaded, also when one is replayed.
    loaded = harness.load_replay_spaces(list(spaces))
    for space in loaded:
        mine = done[done["problem"] == space.problem]
        # A marker row (seed -1) says the order does not apply to this space.
        if (mine["seed"] < 0).any():
            continue
        missing = [s for s in seeds if s not in set(mine["seed"].astype(int))]
        if not missing:
            continue
        # Only the count to the threshold is scored: online runs end at their first hit.
        rows = harness.replay_spaces(loaded, [order], missing, max_benchmarks=max_benchmarks,
                                     progress=False, only=[space.problem], stop_at_hit=True)
        if rows.empty:  # the order does not apply here: remember that with a marker row
            rows = pd.DataFrame([{**dict.fromkeys(harness.COLUMNS, 0), "problem": space.problem,
                                  "device": space.device, "order": order, "seed": -1,
                                  "benchmarks_to_threshold": np.nan, "best_so_far": "[]"}])
        rows.to_csv(checkpoint, mode="a", header=False, index=False)
        parts.append(rows)
        print(f"  {order}: {space.problem} done", file=sys.stderr, flush=True)
    rows = typed_rows(pd.concat(parts, ignore_index=True))
    return rows[rows["seed"].isin(list(seeds))].reset_index(drop=True)


def space_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (space, method): runs, median (miss = never), hit@50, hit@200."""
    out = []
    for (problem, order), group in rows.groupby(["problem", "order"], sort=False):
        b = group["benchmarks_to_threshold"].to_numpy(dtype=np.float64)
        record: dict[str, object] = {
            "problem": problem, "order": order, "runs": len(group),
            "median": float(np.median(np.where(np.isfinite(b), b, np.inf))),
        }
        for budget in HITS:
            record[f"hit@{budget}"] = float((b <= budget).mean())
        out.append(record)
    table = pd.DataFrame(out)
    # Random's figure is its exact expectation, not a sample median.
    exact = rows.groupby("problem")["random_expected"].first()
    for problem, expected in exact.items():
        table.loc[(table["problem"] == problem) & (table["order"] == "random"), "median"] = expected
    return table


def comparison(table: pd.DataFrame, ours: str = "online") -> pd.DataFrame:
    """Per space: our median and hit rates, the best peer, and the ratio ours / best peer."""
    out = []
    for problem, group in table.groupby("problem", sort=False):
        peers = group[group["order"] != ours]
        mine = group[group["order"] == ours]
        if mine.empty or peers.empty:
            continue
        best = peers.iloc[int(np.argmin(peers["median"].to_numpy(dtype=np.float64)))]
        m = mine.iloc[0]
        out.append({
            "space": problem, "ours": m["median"], "hit@50": m["hit@50"], "hit@200": m["hit@200"],
            "best peer": best["order"], "peer median": best["median"],
            "ratio": m["median"] / best["median"],
        })
    return pd.DataFrame(out)


def _cell(value: object) -> str:
    if isinstance(value, float):
        if not np.isfinite(value):
            return "miss"
        return f"{value:.2f}" if abs(value) < 2 else f"{value:.1f}"
    return str(value)


def markdown(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def wide(table: pd.DataFrame, column: str) -> pd.DataFrame:
    """Spaces as rows, methods as columns."""
    pivot = table.pivot(index="problem", columns="order", values=column)
    order = [o for o in (*PEER_ORDERS, "kt_genetic_algorithm", "kt_dual_annealing", "kt_pso",
                         "kt_bayes_opt", *OURS) if o in pivot.columns]
    # A method that does not apply to a space (gbm without features) is "n/a", not a miss.
    return pivot[order].astype(object).where(pivot[order].notna(), "n/a").reset_index()


def main(argv: Sequence[str] | None = None) -> int:
    from dispatchtune.benchmarks.kerneltuner_peers import STRATEGIES
    from dispatchtune.benchmarks.peers import kernel_tuner_part
    from dispatchtune.evaluation.harness import write_report

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--tpe-seeds", type=int, default=10)
    parser.add_argument("--tpe-budget", type=int, default=300)
    parser.add_argument("--bo-seeds", type=int, default=3,
                        help="seeds of Kernel Tuner's bayes_opt (minutes per run on 2 cores)")
    parser.add_argument("--max-benchmarks", type=int, default=1000)
    parser.add_argument("--spaces", type=Path, nargs="+", metavar="CACHE")
    parser.add_argument("--orders", nargs="*", default=[*PEER_ORDERS, *OURS])
    parser.add_argument("--strategies", nargs="*", default=list(STRATEGIES))
    parser.add_argument("--fresh", nargs="*", default=[], help="harness orders to replay again")
    args = parser.parse_args(argv)
    spaces = args.spaces or sorted(DATA_DIR.glob("*.json*"))
    start = time.perf_counter()
    try:
        if not spaces:
            raise InputError(f"no Kernel Tuner cache in {DATA_DIR}")
        args.output_dir.mkdir(parents=True, exist_ok=True)
        seeds = list(range(args.seeds))
        parts = []
        cheap = [s for s in args.strategies if s != "bayes_opt"]
        if cheap:
            parts.append(kernel_tuner_part(spaces, cheap, seeds, 0.05, args.max_benchmarks,
                                           args.output_dir, full_bayes_opt=False))
        for order in args.orders:
            tpe = order == "tpe"
            parts.append(harness_rows(
                spaces, order, list(range(args.tpe_seeds)) if tpe else seeds,
                min(args.tpe_budget, args.max_benchmarks) if tpe else args.max_benchmarks,
                args.output_dir, fresh=order in args.fresh))
        if "bayes_opt" in args.strategies:  # last: the slowest peer
            parts.append(kernel_tuner_part(spaces, ["bayes_opt"], list(range(args.bo_seeds)), 0.05,
                                           args.max_benchmarks, args.output_dir, full_bayes_opt=False))
    except DispatchTuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = pd.concat(parts, ignore_index=True)
    table = space_table(rows)
    command = " ".join(["python", "benchmarks/suite.py", *sys.argv[1:]])
    report = write_report(rows, args.output_dir, 0.05, f"Development suite: {len(spaces)} Kernel "
                          "Tuner spaces", args.max_benchmarks, command)
    text = "\n\n".join([
        "Median benchmarks to 5% of the best (random: exact expectation; a miss counts as never)",
        markdown(wide(table, "median")), "Hit rate within 200 benchmarks",
        markdown(wide(table, "hit@200")), "Online search against the best peer",
        markdown(comparison(table)),
        f"{len(rows)} runs, {time.perf_counter() - start:.0f} s wall; report: {report}",
    ])
    (args.output_dir / "suite_summary.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
