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

import logging
import re
from collections.abc import Mapping

import numpy as np
import pandas as pd

from dispatchtune.datasets.kerneltuner import KernelTunerGemm, KernelTunerSpace
from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.features.extract import ProblemScalars, TargetScalars, features_frame

logger = logging.getLogger(__name__)

def _nvidia(sms: int, shared_kib: int) -> TargetScalars:
    # Every NVIDIA architecture since Maxwell: 4 sub-partitions per SM, a 64K x 32-bit register
    # file per SM (= 512 registers per lane of each sub-partition), 32-thread warps.
    return TargetScalars(is_gpu=True, compute_units=sms, simds_per_cu=4,
                         max_workgroup_memory_bytes=shared_kib * 1024, registers_per_simd=512,
                         subgroup_size=32)


def _amd_cdna(cus: int, vgprs: int) -> TargetScalars:
    # GCN / CDNA: 4 SIMDs per CU, 64 KiB LDS per workgroup, 64-wide wavefronts; `vgprs` per lane
    # of a SIMD (GCN 256; CDNA2/3 512 with the accumulation registers).
    return TargetScalars(is_gpu=True, compute_units=cus, simds_per_cu=4,
                         max_workgroup_memory_bytes=65536, registers_per_simd=vgprs,
                         subgroup_size=64)


def _amd_rdna(cus: int, vgprs: int) -> TargetScalars:
    # RDNA: 2 SIMD32 per CU, 64 KiB LDS per workgroup; HIP compiles for 32-wide waves by default
    # on these parts. `vgprs` per lane of a SIMD (RDNA2 1024; Navi 31/32 1536).
    return TargetScalars(is_gpu=True, compute_units=cus, simds_per_cu=2,
                         max_workgroup_memory_bytes=65536, registers_per_simd=vgprs,
                         subgroup_size=32)


#: Hardware facts of common GPUs, from the vendors' specification sheets and architecture
#: whitepapers (NVIDIA Turing/Ampere/Ada/Hopper whitepapers and CUDA C Programming Guide,
#: "compute capabilities" table, for SM counts and shared memory per block; AMD product pages and
#: the Vega/CDNA/RDNA ISA manuals for CU counts, LDS and VGPRs). Matched by the longest key that occurs
#: in `device_name` (case-insensitive, not inside a longer model number); facts given by the
#: user (`register_device`) take precedence. Grouped by architecture generation.
_GENERATIONS: dict[str, dict[str, TargetScalars]] = {
    # Turing (CC 7.5): 64 KiB shared memory per block.
    "nvidia turing": {
        "2080 ti": _nvidia(68, 64), "titan rtx": _nvidia(72, 64), "2080 super": _nvidia(48, 64),
        "2080": _nvidia(46, 64), "2070": _nvidia(36, 64), "t4": _nvidia(40, 64)},
    # Volta (CC 7.0): 96 KiB.
    "nvidia volta": {"v100": _nvidia(80, 96), "titan v": _nvidia(80, 96)},
    # Ampere GA10x (CC 8.6): 99 KiB per block (100 KiB per SM); A100/A30 (CC 8.0): 163 KiB (164).
    "nvidia ampere": {
        "a4000": _nvidia(48, 100), "a5000": _nvidia(64, 100), "a6000": _nvidia(84, 100),
        "3090": _nvidia(82, 100), "3080": _nvidia(68, 100), "3070": _nvidia(46, 100),
        "3060": _nvidia(28, 100), "a10": _nvidia(72, 100), "a40": _nvidia(84, 100),
        "a100": _nvidia(108, 164), "a30": _nvidia(56, 164)},
    # Ada (CC 8.9): 99 KiB per block.
    "nvidia ada": {
        "4090": _nvidia(128, 100), "4080": _nvidia(76, 100), "4070": _nvidia(46, 100),
        "l40": _nvidia(142, 100), "l40s": _nvidia(142, 100), "l4": _nvidia(58, 100)},
    # Hopper H100 SXM5 / H200 (CC 9.0): 227 KiB (228).
    "nvidia hopper": {"h100": _nvidia(132, 228), "h200": _nvidia(132, 228)},
    # AMD: Vega 20 (MI50 60 CUs, MI60 64: a shared "MI50/MI60" name reads as the MI50), CDNA 1-3.
    # An MI250(X) is two dies, each its own HIP device of 104 (110) CUs.
    "amd gcn5": {"mi50": _amd_cdna(60, 256), "mi60": _amd_cdna(64, 256)},
    "amd cdna1": {"mi100": _amd_cdna(120, 256)},
    "amd cdna2": {"mi210": _amd_cdna(104, 512), "mi250": _amd_cdna(104, 512),
                  "mi250x": _amd_cdna(110, 512)},
    "amd cdna3": {"mi300x": _amd_cdna(304, 512)},
    # RDNA 2 (Navi 21/23) and RDNA 3 (Navi 31/32) workstation and desktop cards.
    "amd rdna2": {
        "w6600": _amd_rdna(28, 1024), "w6800": _amd_rdna(60, 1024), "6800": _amd_rdna(60, 1024),
        "6800 xt": _amd_rdna(72, 1024), "6900 xt": _amd_rdna(80, 1024)},
    "amd rdna3": {
        "w7700": _amd_rdna(48, 1536), "w7800": _amd_rdna(70, 1536), "w7900": _amd_rdna(96, 1536),
        "7900 xt": _amd_rdna(84, 1536), "7900 xtx": _amd_rdna(96, 1536)},
}
KT_DEVICES: dict[str, TargetScalars] = {k: f for table in _GENERATIONS.values() for k, f in table.items()}
#: The architecture generation of each `KT_DEVICES` key (what `same_architecture` compares).
KT_GENERATIONS: dict[str, str] = {k: g for g, table in _GENERATIONS.items() for k in table}

#: Facts the user gave for a device (`register_device`), consulted before `KT_DEVICES`.
USER_DEVICES: dict[str, TargetScalars] = {}

_WARP = 32


def register_device(name: str, facts: TargetScalars) -> None:
    """Use `facts` for every device whose name contains `name` (case-insensitive)."""
    if not name.strip():
        raise InputError("a device name to register facts for is empty")
    USER_DEVICES[name.strip().lower()] = facts


def _device_key(table: Mapping[str, object], device_name: str) -> str | None:
    """The longest key of `table` that names `device_name`."""
    wanted = device_name.lower()
    for key in sorted(table, key=len, reverse=True):
        # "a4000" must not match "a40000", nor "t4" match "rtx 4090": whole model numbers only.
        if re.search(rf"(?<![0-9a-z]){re.escape(key)}(?![0-9a-z])", wanted):
            return key
    return None


def device_facts(device_name: str) -> TargetScalars | None:
    """Hardware scalars of a device, or None when neither the user nor the table knows it."""
    for table in (USER_DEVICES, KT_DEVICES):
        key = _device_key(table, device_name)
        if key is not None:
            return table[key]
    return None


def device_generation(device_name: str) -> str | None:
    """The architecture generation of a device in the table ("nvidia ampere"), else None."""
    key = _device_key(KT_DEVICES, device_name)
    return None if key is None else KT_GENERATIONS[key]


_VENDORS = {
    "nvidia": r"nvidia|geforce|\brtx\b|\bgtx\b|titan|tesla|quadro",
    "amd": r"\bamd\b|radeon|instinct|\bmi\d{2,3}|\bgfx\d",
    "intel": r"intel|xeon|\barc\b|iris",
}


def device_vendor(device_name: str) -> str | None:
    """The vendor a device name says (None when it names none)."""
    wanted = device_name.lower()
    return next((v for v, pattern in _VENDORS.items() if re.search(pattern, wanted)), None)


def same_architecture(a: str, b: str) -> bool:
    """Whether two devices share an architecture: the same vendor and the same generation (Turing,
    Ampere, CDNA2, RDNA3, ...) where both are in the table, else the same subgroup (warp /
    wavefront) width where the facts of both are known; a device whose vendor is unknown matches
    only a device of the same name (an empty name matches none). What is fast on one
    architecture (thread counts, tile shapes) need not be on another: learned orders transfer
    within one, not across."""
    if a == b:
        return bool(a.strip())
    vendor = device_vendor(a)
    if vendor is None or vendor != device_vendor(b):
        return False
    generation_a, generation_b = device_generation(a), device_generation(b)
    if generation_a is not None and generation_b is not None:
        return generation_a == generation_b
    facts_a, facts_b = device_facts(a), device_facts(b)
    return facts_a is None or facts_b is None or facts_a.subgroup_size == facts_b.subgroup_size


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


def target_scalars(space: KernelTunerSpace) -> TargetScalars | None:
    """The hardware scalars of the device a cache was measured on (None: unknown device)."""
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
    candidates, problem = gemm_candidate_columns(table), gemm_scalars(gemm)
    facts = device_facts(device_name)
    if facts is not None:
        return features_frame(candidates, problem, facts)
    _note_unknown_device(device_name)
    # Features that need device facts (occupancy, waves, fits-in-shared-memory, ...) are those that
    # change with them: computed for two different devices, they differ; they become NaN (missing).
    features = features_frame(candidates, problem, _PROBE_DEVICES[0])
    other = features_frame(candidates, problem, _PROBE_DEVICES[1])
    same = np.isclose(features.to_numpy(dtype=np.float64), other.to_numpy(dtype=np.float64),
                      equal_nan=True).all(axis=0)
    return features.astype(np.float64).where(np.broadcast_to(same, features.shape))


#: Two devices that differ in every fact: a feature that differs between them needs device facts.
_PROBE_DEVICES = (
    TargetScalars(is_gpu=True, compute_units=68, simds_per_cu=4, max_workgroup_memory_bytes=65536,
                  registers_per_simd=512, subgroup_size=32),
    TargetScalars(is_gpu=True, compute_units=7, simds_per_cu=2, max_workgroup_memory_bytes=4096,
                  registers_per_simd=64, subgroup_size=64),
)
_noted: set[str] = set()


def _note_unknown_device(device_name: str) -> None:
    if device_name not in _noted:
        _noted.add(device_name)
        logger.warning("no hardware facts for device %r: its features that need them (occupancy, "
                       "shared-memory fit, waves) are left missing; register_device() gives them",
                       device_name or "(unnamed)")


def kerneltuner_features(space: KernelTunerSpace, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """The feature table of a cache's rows (all rows by default); GEMM spaces only."""
    table = space.table if rows is None else rows
    return gemm_features(table, space.gemm(), space.device_name)
