"""`dispatchtune rank FILE --target T`: each root op's candidates in benchmark order."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dispatchtune.cli.options import (
    AT_LEAST_0,
    absolute_path,
    add_cost_model,
    add_number,
    add_seed,
    add_target,
    order_of,
    output_file,
)
from dispatchtune.costmodel.rank import ORDERS

# Columns worth showing in the terminal; the CSV keeps every column.
_SHOWN = (
    "candidate_id", "score", "pipeline", "tile_b", "tile_m", "tile_n", "tile_k", "vec_m",
    "vec_n", "intrinsic", "subgroups_m", "subgroups_n", "workgroup_threads", "prefetch_stages",
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "rank",
        help="enumerate and rank the candidates of every root op in an MLIR file",
        description="Enumerate each tunable root op's candidates (Z3) and print them in benchmark "
        "order: the handwritten heuristic (docs/heuristic.md), a learned cost model (the target's "
        "installed default or --cost-model FILE) or the seeded random baseline.",
    )
    parser.add_argument("file", type=absolute_path,
                        help="dumped dispatch benchmark (.mlir), model/function MLIR, or a dir")
    add_target(parser)
    add_cost_model(parser, ORDERS, "heuristic (default), model (learned) or random")
    add_seed(parser, 0, "seed of the random order and of tie-breaks (default %(default)s)")
    add_number(parser, "--limit", kind=int, valid=AT_LEAST_0, default=10,
               help="rows shown per op (default %(default)s)")
    parser.add_argument("--csv", type=absolute_path, help="write the full ranked tables here (all ops)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from dispatchtune.costmodel.rank import rank
    from dispatchtune.ir.frontend import load_problems
    from dispatchtune.search import enumerate_candidates
    from dispatchtune.targets import get_target

    if args.csv is not None:
        output_file(args.csv, "--csv")
    target = get_target(args.target)
    order = order_of(args)
    model = None
    if order == "model":
        from dispatchtune.costmodel.defaults import model_for_target

        model, where = model_for_target(target.name, args.cost_model)
        print(f"ranking with the {where}", file=sys.stderr)
    tables = []
    for problem in load_problems(args.file, target):
        cset = enumerate_candidates(problem, target)
        ranked = rank(cset, order=order, seed=args.seed, model=model)
        print(f"{problem.key}: {problem.describe()}: {len(ranked)} candidates, {order} order")
        shown = [c for c in _SHOWN if c in ranked.columns]
        if len(ranked) and args.limit:
            print(ranked[shown].head(args.limit).to_string(index=False))
        tables.append(ranked.assign(problem_key=problem.key))
    if args.csv and tables:
        pd.concat(tables, ignore_index=True).to_csv(args.csv, index=False)
        print(f"ranked tables written to {args.csv}", file=sys.stderr)
    return 0
