"""CLI subcommands on the IREE side: `inspect`, `targets`, and the tuning loop's `tune`."""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

from dispatchtune.problem import DIM_CLASSES, Problem
from dispatchtune.targets import get_target, list_targets


def register(subparsers: Any) -> None:
    inspect = subparsers.add_parser(
        "inspect",
        help="list the tunable root ops in an MLIR file",
        description="Print every tunable root op (contraction, convolution, attention) found in a "
        "dumped dispatch benchmark or a model/function MLIR file.",
    )
    inspect.add_argument("file", help="dumped dispatch benchmark (.mlir), model/function MLIR, or a dir")
    inspect.add_argument("--target", default="host", help="target used to form dispatches (default host)")
    inspect.add_argument("--json", action="store_true", help="one JSON object per root op")
    inspect.set_defaults(handler=run_inspect)

    targets = subparsers.add_parser("targets", help="list the known targets and their key facts")
    targets.add_argument("--json", action="store_true", help="one JSON object per target")
    targets.set_defaults(handler=run_targets)

    # The tuning loop lives in its own module; it registers `tune` when present.
    try:
        tune = importlib.import_module("dispatchtune.tuner.tune_command")
    except ModuleNotFoundError as exc:
        if exc.name != "dispatchtune.tuner.tune_command":
            raise
    else:
        tune.register_tune(subparsers)
    # Whole-model tuning (`tune-model`) likewise registers itself when present.
    try:
        tune_model = importlib.import_module("dispatchtune.tuner.model_command")
    except ModuleNotFoundError as exc:
        if exc.name != "dispatchtune.tuner.model_command":
            raise
    else:
        tune_model.register_tune_model(subparsers)


def _layout(problem: Problem) -> str:
    """Operand layouts as index strings, e.g. `mk,nk->mn` for a transposed-B matmul."""
    letters: dict[int, str] = {}
    names = {"batch": "b", "m": "m", "n": "n", "k": "k", "k1": "k", "k2": "j"}
    for dim_class, loops in problem.dims.items():
        for loop in loops:
            letters[loop] = names.get(dim_class, "")
    if problem.kind == "convolution":
        return "conv"
    parts = []
    for amap in problem.indexing_maps:
        results = amap.split("->")[1].strip(" ()")
        dims = [r.strip() for r in results.split(",") if r.strip()]
        parts.append("".join(letters.get(int(d[1:]), "?") if d.startswith("d") else "?" for d in dims))
    return ",".join(parts[:-1]) + "->" + parts[-1]


def run_inspect(args: argparse.Namespace) -> int:
    from dispatchtune.ir.frontend import load_problems

    problems = load_problems(args.file, get_target(args.target))
    for index, problem in enumerate(problems):
        if args.json:
            print(json.dumps({"index": index, "key": problem.key, **problem.to_dict()}))
            continue
        sizes = ", ".join(
            f"{cls}={'x'.join(map(str, problem.sizes(cls)))}"
            for cls in DIM_CLASSES[problem.kind]
            if problem.sizes(cls)
        )
        print(f"[{index}] {problem.name or '<anonymous>'}")
        print(f"    kind:    {problem.kind} ({problem.op_name})")
        print(f"    sizes:   {sizes}")
        if problem.kind == "convolution":
            print(f"    strides: {list(problem.strides)}  dilations: {list(problem.dilations)}")
        types = " x ".join(problem.input_types) + f" -> {problem.output_type}"
        print(f"    types:   {types}")
        print(f"    layout:  {_layout(problem)}")
        for name, amap in zip(_operand_names(problem), problem.indexing_maps, strict=False):
            print(f"      {name:6s} {amap}")
        print(f"    GFLOP:   {problem.flops / 1e9:.3f}")
        print(f"    key:     {problem.key}")
    return 0


def _operand_names(problem: Problem) -> list[str]:
    if problem.kind == "attention":
        return ["Q", "K", "V", "out"]
    if problem.kind == "convolution":
        return ["input", "filter", "out"]
    return ["lhs", "rhs", "out"]


def run_targets(args: argparse.Namespace) -> int:
    for target in list_targets():
        row: dict[str, Any] = {
            "name": target.name,
            "backend": target.backend,
            "device": target.device_uri,
            "description": target.description,
            "flags": list(target.compile_flags),
        }
        if target.is_gpu:
            gpu = target.gpu_facts()
            row.update(
                arch=gpu.arch,
                compute_units=gpu.compute_units,
                subgroup_sizes=list(gpu.subgroup_sizes),
                max_threads=gpu.max_threads_per_workgroup,
                workgroup_memory_bytes=gpu.max_workgroup_memory_bytes,
                simds_per_cu=gpu.simds_per_cu,
                mma_intrinsics=len(gpu.mma_intrinsics),
            )
            facts = (
                f"{gpu.arch}, {gpu.compute_units} CUs, subgroup {list(gpu.subgroup_sizes)}, "
                f"{gpu.max_workgroup_memory_bytes // 1024} KiB shared memory, "
                f"{gpu.max_threads_per_workgroup} threads/workgroup, "
                f"{len(gpu.mma_intrinsics)} MMA intrinsics"
            )
        else:
            cpu = target.cpu_facts()
            row.update(
                cpu=cpu.cpu,
                cores=cpu.cores,
                native_vector_bytes=cpu.native_vector_bytes,
                vector_registers=cpu.vector_registers,
                l1d_bytes=cpu.l1d_bytes,
                l2_bytes=cpu.l2_bytes,
                l3_bytes=cpu.l3_bytes,
            )
            facts = (
                f"{cpu.cpu}, {cpu.cores} cores, {cpu.native_vector_bytes * 8}-bit vectors x "
                f"{cpu.vector_registers} registers, L1d {cpu.l1d_bytes // 1024} KiB, "
                f"L2 {cpu.l2_bytes // 1024} KiB, L3 {cpu.l3_bytes // 1024 // 1024} MiB"
            )
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{target.name:8s} {target.backend:8s} {target.device_uri:11s} {facts}")
            print(f"{'':8s} {target.description}")
            print(f"{'':8s} flags: {' '.join(target.compile_flags)}")
    return 0
