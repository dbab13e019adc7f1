"""How does a candidate order do against candidates measured on a real GPU?

Reads compact CSVs of IREE tuner runs, one GEMM each (see `benchmarks/data/measured/README.md`:
every candidate's configuration, whether it compiled and ran, and its time), rebuilds the
dispatch from the file name (`..._gemm_M_N_K_<input type>[_<accumulator type>]_t{A,B}.csv`),
enumerates its space on gfx942, finds each measured candidate by meaning (as `expert_order.py`
finds experts: pipeline, intrinsic, workgroup tiles, K tile, subgroup counts, workgroup threads)
and reports for each order:
- where the fastest measured candidate lands in the whole space (position / N, as for experts);
- among the measured candidates found in the space, the position of the fastest, and the time of
  the best of the first k benchmarks as a multiple of the fastest's (k = 1, 5, 10, 20, 50; each
  time over the baseline measured on the same device, as IREE's tuner compares them): what a
  tuning run with a budget of k would have kept. A candidate that failed to build costs no
  benchmark (as in `tune`) and is counted apart; one that built and failed to run takes its turn
  and gives nothing. A second reading follows the whole order, where a candidate nobody measured
  also takes its turn and gives nothing (the cautious bound). `random` is the expectation over
  all orders; `tuner` is the order IREE's tuner generated them in (its candidate ids).
With `--no-heuristic-filters` it also reports how much slower the fastest measured candidate
inside IREE's heuristic filters is (docs/gpu_order.md, part 35).

Usage:
  python benchmarks/measured_order.py benchmarks/data/measured -o out/measured
      [--orders model,heuristic,random] [--cache /tmp/expert_order_cache] [--no-heuristic-filters]
      [--model FILE]
`--model FILE` ranks the `model` order with that model file instead of the installed gfx942
prior (a prior fit without some of these GEMMs, for instance: docs/gpu_order.md, part 36).
Writes report.md and budgets.png to the output dir.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dispatchtune.benchmarks.expert_order import (
    MATCH_COLUMNS,
    SCORERS,
    TARGET,
    Scorer,
    candidate_table,
    expected_position,
    model_file_scorer,
)
from dispatchtune.errors import DispatchTuneError
from dispatchtune.problem import Problem
from dispatchtune.targets import get_target

BUDGETS = (1, 5, 10, 20, 50)
_NAME = re.compile(r"gemm_(\d+)_(\d+)_(\d+)_([a-zA-Z0-9]+?)(?:_([a-z]\d+))?_t([AB])$")
_PIPELINES = {"VD": "VectorDistribute", "TAF": "TileAndFuse"}
_ACCUMULATOR = {"i8": "i32"}


def problem_of(path: Path) -> Problem:
    """The GEMM a measurement file is named after (`..._gemm_M_N_K_f16_f32_tB.csv`)."""
    found = _NAME.search(path.stem)
    if found is None:
        raise ValueError(f"{path.name}: no ..._gemm_M_N_K_<type>[_<acc>]_t{{A,B}} in the name")
    m, n, k, element, accumulator, transposed = found.groups()
    return Problem.matmul(int(m), int(n), int(k), element, element,
                          accumulator or _ACCUMULATOR.get(element, "f32"),
                          transpose_a=transposed == "A", transpose_b=transposed == "B")


def measured_rows(path: Path) -> pd.DataFrame:
    """A file's candidates in candidate-table terms, with `time_us` (NaN where it failed) and
    `relative`: the time over the baseline measured on the same device. IREE's tuner spreads
    candidates over several GPUs of one machine, whose baselines differ by up to 15%
    (`square_gemm_1024...`: 57.17 and 65.5 us), so times are compared as `relative`."""
    frame = pd.read_csv(path)
    frame = frame[frame["mma"].notna()].copy()  # candidate 0 is the baseline: no configuration
    ok = frame["benchmark_status"].astype(str).str.lower().eq("true")
    frame["time_us"] = pd.to_numeric(frame["time_us"], errors="coerce").where(ok)
    frame["compiled"] = frame["compile_status"].astype(str).str.lower().eq("true")
    return pd.DataFrame({
        "candidate_id": frame["candidate_id"].astype(int),
        "pipeline": frame["pipeline"].map(lambda p: _PIPELINES.get(p, p)),
        "intrinsic": frame["mma"].astype(str),
        "tile_b": 1,
        "tile_m": frame["m"].astype(int), "tile_n": frame["n"].astype(int),
        "tile_k": frame["k"].astype(int),
        "subgroups_m": frame["sg_m"].astype(int), "subgroups_n": frame["sg_n"].astype(int),
        "workgroup_threads": (frame["wg_x"] * frame["wg_y"] * frame["wg_z"]).astype(int),
        "compiled": frame["compiled"], "time_us": frame["time_us"],
        "relative": frame["time_us"] / pd.to_numeric(frame["baseline_us"], errors="coerce"),
    }).reset_index(drop=True)


def best_after(times_in_order: np.ndarray, fastest: float) -> list[float]:
    """Best time among the first k benchmarks, over the fastest, for each budget k."""
    best = np.fmin.accumulate(np.where(np.isnan(times_in_order), np.inf, times_in_order))
    return [float(best[min(k, len(best)) - 1] / fastest) for k in BUDGETS]


def random_best_after(times: np.ndarray, fastest: float) -> list[float]:
    """Expected best of k candidates drawn without replacement, over the fastest."""
    ranked = np.sort(np.where(np.isnan(times), np.inf, times))
    n = len(ranked)
    result = []
    for k in BUDGETS:
        k = min(k, n)
        # P(the best of k is the i-th fastest) = C(n - i, k - 1) / C(n, k), i = 1..n.
        weights = np.array([math.comb(n - i, k - 1) for i in range(1, n + 1)], dtype=float)
        weights /= math.comb(n, k)
        finite = np.isfinite(ranked)
        # A draw of only failures keeps nothing: count it at the slowest measured time.
        values = np.where(finite, ranked, ranked[finite].max())
        result.append(float(weights @ values / fastest))
    return result


def failed_builds(scores: np.ndarray, compiled: np.ndarray, benchmarks: int = BUDGETS[-1]) -> int:
    """Candidates an order would build, and see fail, before its `benchmarks`-th that builds."""
    built = compiled[np.argsort(-scores, kind="stable")]
    last = np.flatnonzero(np.cumsum(built) == min(benchmarks, int(built.sum())))[0]
    return int((~built[:last + 1]).sum())


def rows_in(table: pd.DataFrame, candidates: pd.DataFrame) -> np.ndarray:
    """The table row of each candidate with the same configuration (`MATCH_COLUMNS`, as
    `expert_order.py` matches experts), -1 where the table has none."""
    keys = list(MATCH_COLUMNS)
    # The table's pipeline is categorical: compare as text, as `expert_mask` does.
    index = table[keys].astype({"pipeline": str}).assign(row=np.arange(len(table)))
    found = candidates[keys].astype({"pipeline": str}).merge(
        index.drop_duplicates(keys), on=keys, how="left")["row"]
    return found.fillna(-1).to_numpy(dtype=int)


def measure(path: Path, orders: Sequence[str], cache: Path, heuristic_filters: bool,
            scorers: Mapping[str, Scorer] = SCORERS) -> dict:
    """One measurement file: the fastest's position per order and each order's budget curve."""
    problem = problem_of(path)
    target = get_target(TARGET)
    table = candidate_table(problem, cache, heuristic_filters)
    measured = measured_rows(path)
    rows = rows_in(table, measured)
    # A candidate that fails to build is found before benchmarking and costs no budget (as in
    # `tune`); one that builds and fails to run takes its turn.
    in_space = measured[rows >= 0].assign(row=rows[rows >= 0])
    found = in_space[in_space["compiled"]].reset_index(drop=True)
    times = found["relative"].to_numpy(dtype=float)
    if not np.isfinite(times).any():
        raise ValueError("no measured candidate in the space ran")
    best = int(np.nanargmin(times))
    fastest = float(times[best])
    winners = times == fastest  # several candidates can share the fastest time
    result: dict = {
        "file": path.name, "problem": problem.describe(), "n": len(table),
        "measured": len(measured), "built": int(measured["compiled"].sum()),
        "ran": int(measured["time_us"].notna().sum()),
        "in_space": len(in_space), "built_in_space": len(found),
        "ran_in_space": int(np.isfinite(times).sum()),
        "fastest_relative": fastest,
        "fastest_us": float(found["time_us"].to_numpy(dtype=float)[best]),
        "fastest_config": found.iloc[best][
            ["pipeline", "intrinsic", "tile_m", "tile_n", "tile_k", "subgroups_m",
             "subgroups_n", "workgroup_threads"]].to_dict(),
    }
    if not heuristic_filters:
        # How much the whole space gains: the fastest measured inside IREE's filtered space.
        kept = times[rows_in(candidate_table(problem, cache, True), found) >= 0]
        result["filtered_fastest"] = float(np.nanmin(kept)) / fastest if len(kept) else math.inf
    fastest_mask = np.zeros(len(table), dtype=bool)
    fastest_mask[found["row"].to_numpy()[winners]] = True
    # The whole order: a candidate nobody measured takes its turn and gives nothing (it may be
    # fast; this curve is the cautious one), one that failed to build is skipped.
    every = np.full(len(table), np.nan)
    every[found["row"].to_numpy()] = times
    takes_turn = np.ones(len(table), dtype=bool)
    takes_turn[in_space["row"].to_numpy()[~in_space["compiled"].to_numpy()]] = False
    curves: dict[str, list[float]] = {}
    whole: dict[str, list[float]] = {}
    for order in orders:
        scores = np.asarray(scorers[order](problem, table, target), dtype=float)
        result[f"{order}_space_fraction"] = expected_position(scores, fastest_mask) / len(table)
        if order == "random":
            curves[order] = random_best_after(times, fastest)
            whole[order] = random_best_after(every[takes_turn], fastest)
            # The expected first of w winners among n shuffled candidates: (n + 1) / (w + 1).
            w = int(winners.sum())
            result[f"{order}_space_fraction"] = (len(table) + 1) / (w + 1) / len(table)
            result[f"{order}_measured_position"] = (len(found) + 1) / (w + 1)
            continue
        own = scores[found["row"].to_numpy()]
        result[f"{order}_measured_position"] = expected_position(own, winners)
        curves[order] = best_after(times[np.argsort(-own, kind="stable")], fastest)
        ranked = np.argsort(-scores, kind="stable")
        whole[order] = best_after(every[ranked][takes_turn[ranked]], fastest)
        result[f"{order}_failed_builds"] = failed_builds(scores[in_space["row"].to_numpy()],
                                                         in_space["compiled"].to_numpy())
    tuner = np.argsort(found["candidate_id"].to_numpy(), kind="stable")
    curves["tuner"] = best_after(times[tuner], fastest)
    result["tuner_measured_position"] = float(np.flatnonzero(winners[tuner])[0] + 1)
    result["tuner_failed_builds"] = failed_builds(-in_space["candidate_id"].to_numpy(dtype=float),
                                                  in_space["compiled"].to_numpy())
    whole["tuner"] = curves["tuner"]  # the tuner proposes only what it measured
    result["curves"] = curves
    result["whole_curves"] = whole
    return result


def report(results: Sequence[dict], orders: Sequence[str], command: str) -> str:
    lines = ["# Candidate orders against candidates measured on an MI300X (gfx942)", "",
             f"Command: `{command}`", "",
             "| file | N | measured (built, ran) | in the space (built, ran) | fastest | "
             + " | ".join(f"{o}: fastest at (space / measured)" for o in orders)
             + " | tuner: fastest at (measured) |",
             "|---|---:|---|---|---|" + "---|" * len(orders) + "---|"]
    for r in results:
        config = r["fastest_config"]
        short = (f"{config['intrinsic']} {config['tile_m']}x{config['tile_n']}x{config['tile_k']}"
                 f" {config['subgroups_m']}x{config['subgroups_n']} sg, "
                 f"{config['workgroup_threads']} thr, {r['fastest_us']:g} us, "
                 f"{r['fastest_relative']:.2f}x the baseline")
        cells = [f"{100 * r[f'{o}_space_fraction']:.1f}% / {r[f'{o}_measured_position']:.0f}"
                 for o in orders]
        lines.append(f"| {r['file']} | {r['n']} | {r['measured']} ({r['built']}, {r['ran']}) | "
                     f"{r['in_space']} ({r['built_in_space']}, {r['ran_in_space']}) | {short} | "
                     + " | ".join(cells)
                     + f" | {r['tuner_measured_position']:.0f} |")
    if "filtered_fastest" in results[0]:
        ratios = [r["filtered_fastest"] for r in results]
        lines += ["", "The fastest measured candidate inside IREE's heuristic filters, as a "
                  "multiple of the fastest measured in the whole space: "
                  + ", ".join(f"{r['file'].removesuffix('.csv')} {v:.3f}"
                              for r, v in zip(results, ratios, strict=True))
                  + f" (median {np.median(ratios):.3f})."]
    lines += ["", f"Medians over the {len(results)} files (best of k: the measured candidates "
              "in each order / the whole order, where a candidate nobody measured takes its "
              "turn and gives nothing):", "",
              "| order | fastest at: position / N in the space | fastest at: position among the "
              "measured | " + " | ".join(f"best of k={k}" for k in BUDGETS) + " |",
              "|---|---:|---:|" + "---:|" * len(BUDGETS)]
    for order in [*orders, "tuner"]:
        space = ([100 * r[f"{order}_space_fraction"] for r in results]
                 if f"{order}_space_fraction" in results[0] else [])
        position = [r[f"{order}_measured_position"] for r in results]
        measured = np.median([r["curves"][order] for r in results], axis=0)
        whole = np.median([r["whole_curves"][order] for r in results], axis=0)
        lines.append(f"| {order} | " + (f"{np.median(space):.1f}%" if space else "")
                     + f" | {np.median(position):.0f} | "
                     + " | ".join(f"{a:.3f} / {b:.3f}" for a, b in zip(measured, whole,
                                                                       strict=True)) + " |")
    lines += ["", "Best of the first k benchmarks (the measured candidates in the space that "
              "built, in each order's own sequence; builds that fail cost no benchmark), as a "
              "multiple of the fastest measured, and the failed builds an order meets before "
              f"its {BUDGETS[-1]}th benchmark:", "",
              "| file | order | " + " | ".join(f"k={k}" for k in BUDGETS) + " | failed builds |",
              "|---|---|" + "---:|" * (len(BUDGETS) + 1)]
    for r in results:
        for order, curve in r["curves"].items():
            failed = r.get(f"{order}_failed_builds", "")
            lines.append(f"| {r['file']} | {order} | "
                         + " | ".join(f"{v:.3f}" for v in curve) + f" | {failed} |")
    return "\n".join(lines) + "\n"


def plot(results: Sequence[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.6), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        for order, curve in r["curves"].items():
            ax.plot(BUDGETS, curve, marker="o", label=order)
        ax.set_xscale("log")
        ax.set_title(r["file"].removesuffix(".csv"), fontsize=8)
        ax.set_xlabel("benchmarks (k)")
        ax.set_ylabel("best time / fastest measured")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path, help="compact measurement CSVs (*.csv)")
    parser.add_argument("-o", "--output-dir", type=Path, required=True)
    parser.add_argument("--orders", default="model,heuristic,random")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/expert_order_cache"))
    parser.add_argument("--no-heuristic-filters", dest="heuristic_filters", action="store_false")
    parser.add_argument("--model", type=Path, metavar="FILE",
                        help="rank the `model` order with this model file (default: the "
                        "installed gfx942 prior)")
    args = parser.parse_args(argv)
    orders = [o for o in args.orders.split(",") if o]
    unknown = [o for o in orders if o not in SCORERS]
    files = sorted(args.directory.glob("*.csv")) if args.directory.is_dir() else []
    if unknown or not files:
        print(f"error: {'unknown orders ' + ', '.join(unknown) if unknown else 'no *.csv in '}"
              f"{'' if unknown else args.directory}", file=sys.stderr)
        return 2
    scorers = dict(SCORERS)
    if args.model is not None:
        try:
            scorers["model"] = model_file_scorer(args.model)
        except DispatchTuneError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    results = []
    for path in files:
        try:
            results.append(measure(path, orders, args.cache, args.heuristic_filters, scorers))
        except KeyError as exc:
            print(f"warning: {path.name}: not measured: no column {exc}", file=sys.stderr)
        except (DispatchTuneError, ValueError, pd.errors.ParserError) as exc:
            print(f"warning: {path.name}: not measured: {exc}", file=sys.stderr)
    if not results:
        print("error: no measurement file could be read", file=sys.stderr)
        return 2
    args.output_dir.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/measured_order.py " + " ".join(argv or sys.argv[1:])
    text = report(results, orders, command)
    (args.output_dir / "report.md").write_text(text)
    plot(results, args.output_dir / "budgets.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
