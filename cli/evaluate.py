"""`dispatchtune evaluate --dataset ... -o DIR`: replay measured spaces and compare orderings."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from dispatchtune.cli.options import (
    AT_LEAST_1,
    FRACTION,
    absolute_path,
    add_number,
    output_dir,
    path_or_dataset,
    progress_of,
)
from dispatchtune.errors import InputError
from dispatchtune.evaluation.harness import SPLITS


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="replay measured datasets: benchmarks to a near-optimal candidate per ordering",
        description="For each measured space (Kernel Tuner cache, results.jsonl log or directory, "
        "the shipped CPU dataset) and each ordering, count the benchmarks until the first "
        "candidate within --threshold of the best; learned models are trained without the space "
        "they are scored on. Writes report.md, results.csv, runs.csv and best_so_far.png.",
    )
    parser.add_argument("--dataset", nargs="+", required=True, metavar="PATH", type=path_or_dataset,
                        help="Kernel Tuner caches (.json/.json.gz), results.jsonl(.gz) files or dirs, "
                             "shipped:NAME (the shipped CPU datasets: cpu_host, AVX-512; cpu_avx2)")
    parser.add_argument("--orders", default="random,heuristic,gbm,online",
                        help="comma-separated: random,heuristic,rf,gbm,lambdarank,online,tpe "
                        "(default %(default)s)")
    parser.add_argument("--output-dir", "-o", type=absolute_path, required=True)
    add_number(parser, "--threshold", kind=float, valid=FRACTION, default=0.05,
               help="near-optimal: within this fraction of the best (default %(default)s)")
    add_number(parser, "--seeds", kind=int, valid=AT_LEAST_1, default=20,
               help="seeds per ordering (tie-breaks, random, online, tpe; default %(default)s)")
    add_number(parser, "--max-benchmarks", kind=int, valid=AT_LEAST_1, default=1000,
               help="replay at most this many benchmarks per run (default %(default)s)")
    parser.add_argument("--split", choices=SPLITS, default="problem",
                        help="what learned models leave out: the scored space (problem, the "
                        "default), also its workload measured on other devices (workload), or "
                        "its whole device (device)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress output (default: a bar on a terminal, else one line "
                        "per space and order)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dispatchtune.evaluation.harness import hit_budgets, replay_rows, summarize, write_report

    orders = [o.strip() for o in str(args.orders).split(",") if o.strip()]
    if not orders:
        raise InputError("--orders is empty")
    output_dir(args.output_dir, "--output-dir", ("report.md", "results.csv", "runs.csv", "best_so_far.png"))
    rows = replay_rows(args.dataset, orders, range(args.seeds), args.threshold,
                       args.max_benchmarks, args.split, progress=progress_of(args))
    command = "dispatchtune " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = write_report(rows, args.output_dir, args.threshold, "Ordering evaluation",
                          args.max_benchmarks, command)
    overall = summarize(rows, args.max_benchmarks)
    overall = overall[overall["problem"] == "ALL"]
    hit = f"hit@{hit_budgets(args.max_benchmarks)[-1]}"  # the widest within the cap
    shown = overall[["order", "median", "p90", "random_expected", "x_fewer_than_random", hit]]
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"report: {report}", file=sys.stderr)
    return 0
