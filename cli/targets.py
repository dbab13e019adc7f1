"""`dispatchtune targets`: the known targets and their hardware facts."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dispatchtune.targets import Target, list_targets


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("targets", help="list the known targets and their key facts")
    parser.add_argument("--json", action="store_true", help="one JSON object per target")
    parser.set_defaults(handler=run)


def _facts(target: Target) -> tuple[dict[str, Any], str]:
    """A target's hardware facts as JSON fields and as one readable line."""
    if target.is_gpu:
        gpu = target.gpu_facts()
        row: dict[str, Any] = dict(
            arch=gpu.arch,
            compute_units=gpu.compute_units,
            subgroup_sizes=list(gpu.subgroup_sizes),
            max_threads=gpu.max_threads_per_workgroup,
            workgroup_memory_bytes=gpu.max_workgroup_memory_bytes,
            simds_per_cu=gpu.simds_per_cu,
            mma_intrinsics=len(gpu.mma_intrinsics),
        )
        text = (
            f"{gpu.arch}, {gpu.compute_units} CUs, subgroup {list(gpu.subgroup_sizes)}, "
            f"{gpu.max_workgroup_memory_bytes // 1024} KiB shared memory, "
            f"{gpu.max_threads_per_workgroup} threads/workgroup, "
            f"{len(gpu.mma_intrinsics)} MMA intrinsics"
        )
        return row, text
    cpu = target.cpu_facts()
    row = dict(
        cpu=cpu.cpu,
        cores=cpu.cores,
        native_vector_bytes=cpu.native_vector_bytes,
        vector_registers=cpu.vector_registers,
        l1d_bytes=cpu.l1d_bytes,
        l2_bytes=cpu.l2_bytes,
        l3_bytes=cpu.l3_bytes,
    )
    text = (
        f"{cpu.cpu}, {cpu.cores} cores, {cpu.native_vector_bytes * 8}-bit vectors x "
        f"{cpu.vector_registers} registers, L1d {cpu.l1d_bytes // 1024} KiB, "
        f"L2 {cpu.l2_bytes // 1024} KiB, L3 {cpu.l3_bytes // 1024 // 1024} MiB"
    )
    return row, text


def run(args: argparse.Namespace) -> int:
    for target in list_targets():
        facts, text = _facts(target)
        if args.json:
            print(json.dumps({
                "name": target.name,
                "backend": target.backend,
                "device": target.device_uri,
                "description": target.description,
                "flags": list(target.compile_flags),
                **facts,
            }))
        else:
            print(f"{target.name:8s} {target.backend:8s} {target.device_uri:11s} {text}")
            print(f"{'':8s} {target.description}")
            print(f"{'':8s} flags: {' '.join(target.compile_flags)}")
    if not args.json:
        print("Any other GPU IREE knows works by name: gfx<N> (gfx90a, gfx950, gfx1201), "
              "rocm:<product> (rocm:mi250x), sm_<N> or cuda:sm_<N> (sm_86); facts from IREE's target "
              "table.")
    return 0
