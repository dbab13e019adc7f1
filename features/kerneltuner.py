"""Kernel Tuner GEMM spaces mapped onto the common candidate vocabulary, so the same features
(`features.extract`) serve these spaces as IREE candidates.

`dispatchtune.datasets.kerneltuner` reads a cache; this module maps a CLBlast-style GEMM space's
parameters onto candidate columns and supplies the problem and hardware scalars:

| Kernel Tuner | candidate column | meaning |
|---|---|---|
| MWG, NWG, KWG | tile_m, tile_n, tile_k | workgroup tile, elements |
| MDIMC * NDIMC | workgroup_threads | threads per workgroup (thread grid MDIMC x NDIMC) |
| (32) | subgroup_size | NVIDIA warp |
| MDIMC, NDIMC | subgroups_m, subgroups_n | warps along M / N (see below) |
| MWG / subgroups_m, NWG / subgroups_n | vec_m, vec_n | per-subgroup (warp) tile, elements |
| VWM, VWN | load_vec_m, load_vec_n | elements per vectorised load of A / B |
| SA, SB | shared_lhs, shared_rhs | A / B staged in shared memory (0/1) |
| PRECISION | element bytes | 32 -> 4 bytes (f32), 16 -> 2 bytes (f16), 64 -> 8 |
| (none) | mma_m/n/k = 1 | scalar FMA, no matrix intrinsic |

A warp spans min(MDIMC, 32) threads along M (the fastest thread index) and 32 / that along N,
so subgroups_m = MDIMC / min(MDIMC, 32) and subgroups_n = NDIMC / (32 / min(MDIMC, 32)).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dispatchtune.datasets.kerneltuner import KernelTunerGemm, KernelTunerSpace
from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.features.extract import ProblemScalars, TargetScalars, features_frame

#: Hardware facts of the devices in the public Kernel Tuner caches (vendor specifications: SM
#: count, 4 sub-partitions per SM, shared memory per SM, 64K 32-bit registers per SM = 512 per
#: lane of each sub-partition). Matched by a case-insensitive substring of `device_name`.
KT_DEVICES: dict[str, TargetScalars] = {
    "2080 ti": TargetScalars(
        is_gpu=True, compute_units=68, simds_per_cu=4, max_workgroup_memory_bytes=65536,
        registers_per_simd=512, subgroup_size=32,
    ),
    "titan rtx": TargetScalars(
        is_gpu=True, compute_units=72, simds_per_cu=4, max_workgroup_memory_bytes=65536,
        registers_per_simd=512, subgroup_size=32,
    ),
    "a4000": TargetScalars(
        is_gpu=True, compute_units=48, simds_per_cu=4, max_workgroup_memory_bytes=102400,
        registers_per_simd=512, subgroup_size=32,
    ),
}

_WARP = 32


def device_facts(device_name: str) -> TargetScalars:
    """Hardware scalars of a Kernel Tuner device; unknown devices raise a one-line error."""
    wanted = device_name.lower()
    for key, facts in KT_DEVICES.items():
        if key in wanted:
            return facts
    known = ", ".join(KT_DEVICES)
    raise InputError(f"no hardware facts for device {device_name!r}; known: {known}")


def gemm_scalars(gemm: KernelTunerGemm) -> ProblemScalars:
    """The feature scalars of a Kernel Tuner GEMM (A, B and C share one element type)."""
    elem = gemm.element_bytes
    return ProblemScalars(
        kind="contraction", b=1, m=gemm.m, n=gemm.n, k=gemm.k, lhs_bytes=elem, rhs_bytes=elem,
        out_bytes=elem, flops=2.0 * gemm.m * gemm.n * gemm.k,
    )


def problem_scalars(space: KernelTunerSpace) -> ProblemScalars:
    """The feature scalars of the GEMM a cache solves (a one-line error for other kernels)."""
    return gemm_scalars(space.gemm())


def target_scalars(space: KernelTunerSpace) -> TargetScalars:
    """The hardware scalars of the device a cache was measured on."""
    return device_facts(space.device_name)


def gemm_candidate_columns(table: pd.DataFrame) -> pd.DataFrame:
    """A copy of a CLBlast-style GEMM table with the common candidate columns added (module doc)."""

    def col(name: str, default: float) -> np.ndarray:
        if name in table:
            return table[name].to_numpy(dtype=np.float64)
        return np.full(len(table), default)

    mwg, nwg, kwg = col("MWG", 1), col("NWG", 1), col("KWG", 1)
    mdimc, ndimc = col("MDIMC", 1), col("NDIMC", 1)
    if (mdimc <= 0).any() or (ndimc <= 0).any():
        raise DispatchTuneError("Kernel Tuner GEMM space has a non-positive MDIMC/NDIMC")
    warp_m = np.minimum(mdimc, _WARP)  # threads of one warp along M (M is the fastest index)
    warp_n = np.maximum(_WARP / warp_m, 1.0)
    sg_m = np.maximum(mdimc / warp_m, 1.0)
    sg_n = np.maximum(ndimc / warp_n, 1.0)
    return table.assign(
        pipeline="KernelTuner", tile_b=1, tile_m=mwg, tile_n=nwg, tile_k=kwg,
        vec_m=mwg / sg_m, vec_n=nwg / sg_n, mma_m=1, mma_n=1, mma_k=1,
        subgroups_m=sg_m, subgroups_n=sg_n, subgroup_size=_WARP, workgroup_threads=mdimc * ndimc,
        prefetch_stages=0, load_vec_m=col("VWM", 1), load_vec_n=col("VWN", 1),
        shared_lhs=col("SA", 1), shared_rhs=col("SB", 1),
    )


def gemm_features(table: pd.DataFrame, gemm: KernelTunerGemm, device_name: str) -> pd.DataFrame:
    """The feature table of rows of a Kernel Tuner GEMM space (same index as `table`)."""
    return features_frame(gemm_candidate_columns(table), gemm_scalars(gemm),
                          device_facts(device_name))


def kerneltuner_features(space: KernelTunerSpace, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """The feature table of a cache's rows (all rows by default); GEMM spaces only."""
    table = space.table if rows is None else rows
    return gemm_features(table, space.gemm(), space.device_name)
