"""`dispatchtune candidates FILE --target T`: every enumerated configuration of a dispatch."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dispatchtune.cli.options import (
    AT_LEAST_0,
    absolute_path,
    add_heuristic_filters_flag,
    add_number,
    add_target,
    add_waves_per_eu_flag,
    extra_knobs,
    shown,
)
from dispatchtune.errors import InputError

_SUMMARY = ("pipeline", "tile_b", "tile_m", "tile_n", "tile_k", "vec_m", "vec_n", "workgroups")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "candidates",
        help="enumerate every valid configuration of a dispatch (Z3, exact)",
        description=(
            "Enumerate the search space of the root op in FILE: GPU spaces from IREE's own SMT "
            "constraints, CPU spaces from dispatchtune's Z3 model. Prints a table, or JSON lines "
            "with rank, pipeline, knobs and compilation_info."
        ),
    )
    parser.add_argument("file", type=absolute_path,
                        help="MLIR input (model, function or dumped dispatch benchmark)")
    add_target(parser, required=True)
    parser.add_argument("--pipeline", default=None, help="restrict to one pipeline")
    add_number(parser, "--limit", kind=int, valid=AT_LEAST_0, default=None,
               help="print only the first N")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    add_heuristic_filters_flag(parser)
    add_waves_per_eu_flag(parser)
    add_number(parser, "--op-index", kind=int, valid=AT_LEAST_0, default=None,
               help="which root op when FILE has several")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dispatchtune.ir.frontend import load_problems
    from dispatchtune.search import enumerate_candidates
    from dispatchtune.targets import get_target

    target = get_target(args.target)
    knobs = extra_knobs(args, target)  # a flag the target cannot take: one line, up front
    problems = load_problems(args.file, target)
    if not problems:
        raise InputError(f"{shown(args.file)}: no tunable root op found")
    if args.op_index is None:
        if len(problems) > 1:
            raise InputError(
                f"{shown(args.file)} has {len(problems)} root ops; choose one with --op-index "
                f"0..{len(problems) - 1}"
            )
        problem = problems[0]
    elif args.op_index >= len(problems):
        raise InputError(f"--op-index {args.op_index} out of range 0..{len(problems) - 1}")
    else:
        problem = problems[args.op_index]
    candidates = enumerate_candidates(
        problem, target, args.pipeline, args.limit, extra_knobs=knobs,
        heuristic_filters=args.heuristic_filters,
    )
    out = sys.stdout
    if args.json:
        import numpy as np

        from dispatchtune.cli.jsonlines import write_json_lines

        # Enumeration order, unscored: the same lines as `rank --json` with score null.
        table = candidates.table.assign(candidate_id=np.arange(len(candidates)), score=np.nan)
        write_json_lines(candidates, table, problem.key, out)
        return 0
    # With --limit enumeration stops early: the space's size is not known, only the first rows.
    count = (f"the first {len(candidates)} candidates (--limit)"
             if args.limit is not None and len(candidates) == args.limit
             else f"{len(candidates)} candidates")
    print(f"# {problem.describe()} on {target.name}: {count}", file=out)
    if len(candidates):
        print(candidates.table.loc[:, list(_SUMMARY)].to_string(), file=out)
    return 0
