"""`dispatchtune rank FILE --target T`: each root op's candidates in benchmark order."""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

from dispatchtune.cli.jsonlines import write_json_lines
from dispatchtune.cli.options import (
    AT_LEAST_0,
    absolute_path,
    add_cost_model,
    add_heuristic_filters_flag,
    add_number,
    add_seed,
    add_target,
    add_waves_per_eu_flag,
    extra_knobs,
    order_of,
    output_file,
    shown,
)
from dispatchtune.costmodel.rank import ORDERS
from dispatchtune.errors import InputError, skip_dispatch_on_error

if TYPE_CHECKING:  # pandas and numpy load on first use: `dispatchtune --help` stays fast
    from dispatchtune.costmodel.base import CostModel

logger = logging.getLogger(__name__)

_SHOWN_ROWS = 10
# Columns worth showing in the terminal; the CSV keeps every column.
_SHOWN = (
    "candidate_id", "score", "pipeline", "tile_b", "tile_m", "tile_n", "tile_k", "vec_m",
    "vec_n", "intrinsic", "subgroups_m", "subgroups_n", "workgroup_threads", "prefetch_stages",
    "waves_per_eu",
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
    add_cost_model(parser, ORDERS, "heuristic, model (learned) or random")
    add_seed(parser, 0, "seed of the random order and of tie-breaks (default %(default)s)")
    add_number(parser, "--limit", kind=int, valid=AT_LEAST_0, default=None,
               help=f"rows shown per op (default {_SHOWN_ROWS}; with --json every candidate)")
    parser.add_argument("--csv", type=absolute_path, help="write the full ranked tables here (all ops)")
    parser.add_argument("--json", action="store_true",
                        help="the order as JSON lines in the schema of `candidates --json` (rank, "
                        "score, pipeline, knobs, compilation_info; plus problem_key, candidate_id)")
    add_heuristic_filters_flag(parser)
    add_waves_per_eu_flag(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from dispatchtune.costmodel.rank import rank
    from dispatchtune.ir.frontend import load_problems
    from dispatchtune.search import enumerate_candidates
    from dispatchtune.targets import get_target

    if args.csv is not None:
        output_file(args.csv, "--csv", "ranked.csv")
    target = get_target(args.target)
    knobs = extra_knobs(args, target)  # a flag the target cannot take: one line, up front
    order = order_of(args)
    model: CostModel | None = None
    where = ""  # the model's origin, said once something is ranked
    if order == "model":
        from dispatchtune.costmodel.defaults import model_for_target

        model, where = model_for_target(target.name, args.cost_model)
        from dispatchtune.costmodel.heuristic import HeuristicModel

        if isinstance(model, HeuristicModel):
            order = "heuristic"  # no model for this target: the headers say what ranks
    tables: list[pd.DataFrame] = []
    # A model repeats problems (every layer's projections): each is ranked once, as `tune` tunes it.
    loaded = load_problems(args.file, target)
    dispatches = Counter(p.key for p in loaded)
    first: dict[str, Any] = {}
    for loaded_problem in loaded:
        first.setdefault(loaded_problem.key, loaded_problem)
    problems = list(first.values())
    skipped: dict[str, str] = {}
    for problem in problems:
        with skip_dispatch_on_error(problem.key, skipped):
            cset = enumerate_candidates(problem, target, extra_knobs=knobs,
                                        heuristic_filters=args.heuristic_filters)
            ranked = rank(cset, order=order, seed=args.seed, model=model)
        if problem.key in skipped:
            continue
        if where and not tables:
            # Said once something is ranked: input nothing can be ranked from stays one line.
            print(f"ranking with the {where}", file=sys.stderr)
        if args.json:
            head = ranked if args.limit is None else ranked.head(args.limit)
            write_json_lines(cset, head, problem.key, sys.stdout)
            tables.append(ranked.assign(problem_key=problem.key))
            continue
        shared = dispatches[problem.key]
        print(f"{problem.key}: {problem.describe()}: {len(ranked)} candidates, {order} order"
              + (f" ({shared} dispatches of this problem)" if shared > 1 else ""))
        columns = [c for c in _SHOWN if c in ranked.columns]
        limit = _SHOWN_ROWS if args.limit is None else args.limit
        if len(ranked) and limit:
            print(ranked[columns].head(limit).to_string(index=False))
        tables.append(ranked.assign(problem_key=problem.key))
    # What was skipped is said after the tables, so that when nothing could be ranked the one
    # error line says it all, as for any other bad input.
    if not tables:
        key, reason = next(iter(skipped.items()))
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        raise InputError(f"{shown(args.file)}: no dispatch could be ranked: {key}: {reason}{more}")
    for key, reason in skipped.items():
        logger.warning("%s: not ranked: %s", key, reason)
    if args.csv:
        pd.concat(tables, ignore_index=True).to_csv(args.csv, index=False)
        print(f"ranked tables written to {args.csv}", file=sys.stderr)
    return 0
