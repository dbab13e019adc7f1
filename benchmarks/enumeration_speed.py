"""Columnar enumeration vs the reference tool's blocking clauses, side by side, same constraints.

For each space, both methods start from the same SMT-LIB text (IREE's own constraints for GPU,
dispatchtune's Z3 model for CPU) and enumerate every solution projected on the knobs:
  - blocking: Z3 `check()`, read the model, add `Or(knob != value)`, repeat (the reference tool);
  - columnar: `dispatchtune.search.engine` (interval propagation + numpy filtering).
The script asserts that the two solution sets are equal and prints both times and the ratio.
A last section enumerates 100k+ candidate spaces (columnar only: blocking clauses would take
hours) and reports the peak memory of the enumeration.

Run on 2 cores (the script pins itself to at most 2 CPUs):
    .venv/bin/python benchmarks/enumeration_speed.py            # all spaces (a few minutes)
    .venv/bin/python benchmarks/enumeration_speed.py --quick    # gfx942 TileAndFuse 512^3 only
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import z3

from dispatchtune.problem import Problem
from dispatchtune.search import enumerate_candidates
from dispatchtune.search.cpu import cpu_model
from dispatchtune.search.engine import ConstraintSystem, enumerate_blocking
from dispatchtune.search.gpu_space import gpu_spaces
from dispatchtune.targets import get_target


@dataclass
class Space:
    name: str
    assertions: Callable[[], list[z3.BoolRef]]  # fresh Z3 terms for each run
    smtlib: str
    knobs: tuple[str, ...]


def gpu_space(target: str, problem: Problem, pipeline: str, tag: str) -> Space:
    space = next(s for s in gpu_spaces(problem, get_target(target)) if s.pipeline == pipeline)
    return Space(
        name=f"{target} {pipeline} {tag}",
        assertions=lambda: list(z3.parse_smt2_string(space.smtlib)),
        smtlib=space.smtlib,
        knobs=space.knobs,
    )


def cpu_space(problem: Problem, tag: str) -> Space:
    model = cpu_model(problem, get_target("host").cpu_facts())
    solver = z3.Solver()
    solver.add(*model.assertions)
    text = solver.to_smt2()
    return Space(
        name=f"host {model.pipeline} {tag}",
        assertions=lambda: list(z3.parse_smt2_string(text)),
        smtlib=text,
        knobs=model.variables,
    )


def columnar(space: Space) -> set[tuple[int, ...]]:
    system = ConstraintSystem.from_smtlib(space.smtlib)
    rows: set[tuple[int, ...]] = set()
    for chunk in system.solve(space.knobs):
        rows.update(zip(*(chunk[k].tolist() for k in space.knobs), strict=True))
    return rows


def blocking(space: Space) -> set[tuple[int, ...]]:
    return set(enumerate_blocking(space.assertions(), space.knobs))


Solutions = set[tuple[int, ...]]


def timed(fn: Callable[[], Solutions], repeat: int) -> tuple[float, Solutions]:
    times = []
    result: Solutions = set()
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def compare(spaces: Sequence[Space]) -> list[float]:
    print(f"{'space':<52} {'solutions':>9} {'blocking s':>10} {'columnar s':>10} {'ratio':>7}")
    ratios = []
    for space in spaces:
        t_col, got = timed(functools.partial(columnar, space), repeat=3)
        t_blk, want = timed(functools.partial(blocking, space), repeat=1)
        assert got == want, f"{space.name}: sets differ ({len(got)} vs {len(want)})"
        ratio = t_blk / t_col
        ratios.append(ratio)
        print(f"{space.name:<52} {len(got):>9} {t_blk:>10.2f} {t_col:>10.3f} {ratio:>6.0f}x",
              flush=True)
    return ratios


def large_spaces() -> None:
    print("\n100k+ spaces (columnar only; table built by enumerate_candidates)")
    print(f"{'space':<52} {'candidates':>10} {'time s':>7} {'peak MiB':>9} {'table MiB':>9}")
    cases = [
        ("host", Problem.matmul(2520, 2520, 2520, "f32"), None),
        ("host", Problem.batch_matmul(12, 720, 720, 720, "f32"), None),
        ("gfx942", Problem.matmul(3840, 3840, 3840, "f16"),
         {"prefetch_num_stages": (1, 2, 3, 4, 5, 6, 7, 8)}),
    ]
    # IREE's filtered GPU space, as docs/search_space.md measured it (the whole space is larger).
    for target, problem, extra in cases:
        enumerate_candidates(problem, target, limit=1)  # warm: IREE emission is cached
        start = time.perf_counter()
        cands = enumerate_candidates(problem, target, extra_knobs=extra, heuristic_filters=True)
        elapsed = time.perf_counter() - start
        tracemalloc.start()
        enumerate_candidates(problem, target, extra_knobs=extra, heuristic_filters=True)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        table_mib = cands.table.memory_usage(deep=True).sum() / 2**20
        label = f"{target} {problem.describe()[:34]}" + (" x8 prefetch" if extra else "")
        print(f"{label:<52} {len(cands):>10} {elapsed:>7.2f} {peak / 2**20:>9.1f} "
              f"{table_mib:>9.1f}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="gfx942 TileAndFuse 512^3 only")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))[:2]
        os.sched_setaffinity(0, cpus)
        print(f"pinned to CPUs {cpus}; z3 {z3.get_version_string()}")
    f16 = Problem.matmul(512, 512, 512, "f16")
    spaces = [gpu_space("gfx942", f16, "TileAndFuse", "512^3 f16")]
    if not args.quick:
        spaces += [
            gpu_space("gfx942", f16, "VectorDistribute", "512^3 f16"),
            gpu_space("sm_80", f16, "TileAndFuse", "512^3 f16"),
            gpu_space("gfx1100", f16, "VectorDistribute", "512^3 f16"),
            gpu_space("gfx942", Problem.conv2d_nhwc_hwcf(2, 28, 28, 64, 64, 3, 3, "f16"),
                      "TileAndFuse", "conv 2x28x28x64 3x3 (direct)"),
            cpu_space(Problem.matmul(256, 256, 256, "f32"), "256^3 f32"),
        ]
    ratios = compare(spaces)
    median = statistics.median(ratios)
    print(f"ratio blocking/columnar: min {min(ratios):.0f}x, median {median:.0f}x")
    if not args.quick:
        large_spaces()
    return 0 if min(ratios) >= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
