"""Throughput of `extract_features`: prints candidate rows per second (goal: >= 1,000,000).

Usage: python benchmarks/feature_speed.py [--rows 1000000] [--repeats 3]
Builds a synthetic GPU (gfx942-like) and CPU candidate table with the contract's columns and times
the whole table-level call (column reads, every feature, DataFrame assembly).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from dispatchtune.features import ProblemScalars, TargetScalars, features_frame
from dispatchtune.problem import Problem


def gpu_table(rows: int, rng: np.random.Generator) -> pd.DataFrame:
    pow2 = np.array([16, 32, 64, 128, 256])
    sg_m = rng.choice([1, 2, 4], rows)
    sg_n = rng.choice([1, 2, 4], rows)
    return pd.DataFrame(
        {
            "pipeline": pd.Categorical(rng.choice(["TileAndFuse", "VectorDistribute"], rows)),
            "tile_b": np.ones(rows, np.int64),
            "tile_m": rng.choice(pow2, rows),
            "tile_n": rng.choice(pow2, rows),
            "tile_k": rng.choice([16, 32, 64, 128], rows),
            "vec_m": rng.choice([16, 32, 64], rows),
            "vec_n": rng.choice([16, 32, 64], rows),
            "intrinsic": pd.Categorical(rng.choice(["MFMA_F32_16x16x16_F16"], rows)),
            "mma_m": np.full(rows, 16),
            "mma_n": np.full(rows, 16),
            "mma_k": np.full(rows, 16),
            "subgroups_m": sg_m,
            "subgroups_n": sg_n,
            "subgroup_size": np.full(rows, 64),
            "workgroup_threads": sg_m * sg_n * 64,
            "prefetch_stages": rng.choice([0, 2], rows),
        }
    )


def cpu_table(rows: int, rng: np.random.Generator) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "pipeline": pd.Categorical(np.full(rows, "DoubleTilingExpert")),
            "tile_b": np.zeros(rows, np.int64),
            "tile_m": rng.choice([8, 16, 32, 64, 128, 256], rows),
            "tile_n": rng.choice([16, 32, 64, 128, 256], rows),
            "tile_k": rng.choice([1, 2, 4, 8, 16], rows),
            "vec_m": rng.choice([1, 2, 4, 8, 16], rows),
            "vec_n": rng.choice([8, 16, 32, 64], rows),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    problem = ProblemScalars.from_problem(Problem.matmul(4096, 4096, 4096, "f16", transpose_b=True))
    cases = {
        "gpu (gfx942 facts)": (
            gpu_table(args.rows, rng),
            TargetScalars(
                is_gpu=True, compute_units=304, simds_per_cu=4,
                max_workgroup_memory_bytes=65536, registers_per_simd=512, subgroup_size=64,
            ),
        ),
        "cpu (znver4 facts)": (
            cpu_table(args.rows, rng),
            TargetScalars(
                is_gpu=False, compute_units=2, native_vector_bytes=64, vector_registers=32,
                l1_bytes=32768, l2_bytes=1 << 20,
            ),
        ),
    }
    for name, (table, target) in cases.items():
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            frame = features_frame(table, problem, target)
            best = min(best, time.perf_counter() - start)
        print(
            f"{name}: {len(table):,} rows x {frame.shape[1]} features in {best:.3f} s "
            f"(best of {args.repeats}) = {len(table) / best:,.0f} rows/s"
        )


if __name__ == "__main__":
    main()
