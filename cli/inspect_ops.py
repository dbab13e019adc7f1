"""`dispatchtune inspect FILE`: the tunable root ops of an MLIR file, with sizes, types and layout."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dispatchtune.cli.options import absolute_path, add_target
from dispatchtune.problem import DIM_CLASSES, Problem
from dispatchtune.targets import get_target


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="list the tunable root ops in an MLIR file",
        description="Print every tunable root op (contraction, convolution, attention) found in a "
        "dumped dispatch benchmark or a model/function MLIR file.",
    )
    parser.add_argument("file", type=absolute_path,
                        help="dumped dispatch benchmark (.mlir), model/function MLIR, or a dir")
    add_target(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per root op")
    parser.set_defaults(handler=run)


def _layout(problem: Problem) -> str:
    """Operand layouts as index strings, e.g. `mk,nk->mn` for a transposed-B matmul."""
    letters: dict[int, str] = {}
    names = {"batch": "b", "m": "m", "n": "n", "k": "k", "k1": "k", "k2": "j"}
    for dim_class, loops in problem.dims.items():
        for loop in loops:
            letters[loop] = names.get(dim_class, "")
    if problem.kind == "convolution":
        return "pool" if problem.is_pooling else "conv"
    parts = []
    for amap in problem.indexing_maps:
        results = amap.split("->")[1].strip(" ()")
        dims = [r.strip() for r in results.split(",") if r.strip()]
        parts.append("".join(letters.get(int(d[1:]), "?") if d.startswith("d") else "?" for d in dims))
    return ",".join(parts[:-1]) + "->" + parts[-1]


def run(args: argparse.Namespace) -> int:
    from dispatchtune.ir.frontend import load_problems

    problems = load_problems(args.file, get_target(args.target))
    for index, problem in enumerate(problems):
        if args.json:
            print(json.dumps({"index": index, "key": problem.key, **problem.to_dict()}))
            continue
        sizes = ", ".join(
            f"{problem.class_label(cls)}={'x'.join(map(str, problem.sizes(cls)))}"
            for cls in DIM_CLASSES[problem.kind]
            if problem.sizes(cls)
        )
        print(f"[{index}] {problem.name or '<anonymous>'}")
        print(f"    kind:    {problem.kind_label} ({problem.op_name})")
        print(f"    sizes:   {sizes}")
        if problem.kind == "convolution":
            print(f"    strides: {list(problem.strides)}  dilations: {list(problem.dilations)}")
        # A pooling window operand has a shape and no values: only the input's type is read.
        inputs = problem.input_types[:1] if problem.is_pooling else problem.input_types
        types = " x ".join(inputs) + f" -> {problem.output_type}"
        print(f"    types:   {types}")
        print(f"    layout:  {_layout(problem)}")
        for name, amap in zip(_operand_names(problem), problem.indexing_maps, strict=False):
            print(f"      {name:6s} {amap}")
        print(f"    GFLOP:   {problem.flops / 1e9:.3f}")
        print(f"    key:     {problem.key}")
        if problem.is_pooling:
            print("    tuned:   no (rank and tune skip pooling)")
    return 0


def _operand_names(problem: Problem) -> list[str]:
    if problem.kind == "attention":
        return ["Q", "K", "V", "out"]
    if problem.kind == "convolution":
        return ["input", "window" if problem.is_pooling else "filter", "out"]
    return ["lhs", "rhs", "out"]
