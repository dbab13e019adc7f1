"""Columnar feature extraction: (problem, target, candidate table) -> one row of numbers per candidate.

The core, `compute_features`, is a function over numpy columns plus two small records of scalars
(`ProblemScalars`, `TargetScalars`), so any source of candidates can feed it: IREE candidate tables
(`extract_features`) and Kernel Tuner caches (`dispatchtune.features.kerneltuner`) go through the
same code. There is no per-candidate Python loop; every feature is a vectorised numpy expression.

Every feature is in a stable unit (elements, bytes, counts, fractions): a tile K is in elements on
every pipeline, never in "intrinsic units". GPU-only features are 0 on CPU rows and CPU-only features
are 0 on GPU rows, so one schema serves both. Problem-level features (sizes, element bytes, FLOPs)
are included so one learned model can serve many shapes.

Notation in the formulas below: problem GEMM view (B, M, N, K) (convolutions: implicit GEMM;
attention: its Q x K^T product), tile (tb, tm, tn, tk), per-subgroup (GPU) or register (CPU) tile
(vm, vn), element bytes a (LHS), b (RHS), c (output/accumulator), W = workgroup count,
U = compute units (GPU CUs/SMs, CPU cores).

Features (name [unit]: formula):
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from dispatchtune.errors import InputError

if TYPE_CHECKING:
    from dispatchtune.problem import Problem
    from dispatchtune.targets import Target

#: Bumped whenever a feature is added, removed, renamed or changes meaning; learned models store it.
#: 3: GPU `workgroups` (and the occupancy terms built on it) come from the candidate table, and
#: attention's LDS and accumulator features count what IREE stages (issue 22 part 4); CPU features
#: are unchanged, so the shipped host model was re-stamped, not retrained.
FEATURE_SCHEMA_VERSION = 3

#: Resident subgroups (waves/warps) one SIMD can hold; 8 on CDNA3 for occupancy purposes and on
#: NVIDIA Turing/Ampere (32-48 warps per SM over 4 sub-partitions).
MAX_SUBGROUPS_PER_SIMD = 8
#: 32-bit registers per thread spent on addresses, loop counters and operand fragments beside the
#: accumulators; a rough constant, documented so the occupancy estimate can be reproduced by hand.
REGISTER_OVERHEAD_PER_THREAD = 32
#: The widest global load a GPU thread issues (128 bits on AMD and NVIDIA).
MAX_LOAD_BYTES = 16


@dataclass(frozen=True)
class FeatureSpec:
    """One feature: its column name, unit and defining formula."""

    name: str
    unit: str
    formula: str


FEATURES: tuple[FeatureSpec, ...] = (
    # ---- problem level ----
    FeatureSpec("is_gpu", "flag", "1 for a GPU target, 0 for llvm-cpu"),
    FeatureSpec("kind_contraction", "flag", "1 if the op is a contraction"),
    FeatureSpec("kind_convolution", "flag", "1 if the op is a convolution (implicit-GEMM view)"),
    FeatureSpec("kind_attention", "flag", "1 if the op is attention (Q x K^T GEMM view)"),
    FeatureSpec("problem_b", "elements", "B"),
    FeatureSpec("problem_m", "elements", "M"),
    FeatureSpec("problem_n", "elements", "N"),
    FeatureSpec("problem_k", "elements", "K"),
    FeatureSpec("lhs_bytes", "bytes", "a, bytes per LHS element"),
    FeatureSpec("rhs_bytes", "bytes", "b, bytes per RHS element"),
    FeatureSpec("out_bytes", "bytes", "c, bytes per output (accumulator) element"),
    FeatureSpec("log2_flops", "log2(FLOP)", "log2 of the op's FLOPs (2 per multiply-add)"),
    # ---- workgroup tile ----
    FeatureSpec("tile_b", "elements", "tb (at least 1)"),
    FeatureSpec("tile_m", "elements", "tm"),
    FeatureSpec("tile_n", "elements", "tn"),
    FeatureSpec("tile_k", "elements", "tk, K elements per reduction step"),
    FeatureSpec("tile_k_pow2", "flag", "1 if tk is a power of two"),
    FeatureSpec("k_trips", "count", "ceil(K / tk), trip count of the K loop"),
    FeatureSpec("tile_mn_ratio", "ratio", "min(tm, tn) / max(tm, tn)"),
    FeatureSpec("wg_area_to_volume", "1/element", "(tm*tk + tn*tk) / (tm*tn*tk)"),
    FeatureSpec("wg_intensity", "FLOP/byte", "2*tm*tn*tk / (tm*tk*a + tn*tk*b), per K step"),
    FeatureSpec(
        "workgroups", "count",
        "W = ceil(B/tb) * ceil(M/tm) * ceil(N/tn) (GPU: the table's count; attention: over B, M "
        "and the value head dim)",
    ),
    FeatureSpec("workgroups_per_cu", "count", "W / U (U = GPU compute units, CPU cores)"),
    FeatureSpec(
        "wave_quantization", "fraction", "(ceil(W/U) - W/U) / ceil(W/U), idle share of last wave"
    ),
    FeatureSpec(
        "padding_waste",
        "fraction",
        "1 - M*N*K / (ceil(M/tm)*tm * ceil(N/tn)*tn * ceil(K/tk)*tk), work spent on padding",
    ),
    FeatureSpec("tile_divides_problem", "flag", "1 if tm | M, tn | N and tk | K"),
    FeatureSpec("vec_m", "elements", "vm (GPU: per-subgroup tile M; CPU: register tile M)"),
    FeatureSpec("vec_n", "elements", "vn (GPU: per-subgroup tile N; CPU: register tile N)"),
    FeatureSpec("vec_divides_tile", "flag", "1 if vm | tm and vn | tn"),
    # ---- GPU ----
    FeatureSpec("threads", "count", "threads per workgroup"),
    FeatureSpec("subgroup_size", "count", "threads per subgroup (wave/warp)"),
    FeatureSpec("subgroups", "count", "S = threads / subgroup_size"),
    FeatureSpec("subgroups_per_simd", "count", "S / SIMDs per CU"),
    FeatureSpec("subgroups_simd_multiple", "flag", "1 if S is a multiple of the SIMDs per CU"),
    FeatureSpec("mma_m", "elements", "intrinsic M (1 for scalar FMA)"),
    FeatureSpec("mma_n", "elements", "intrinsic N (1 for scalar FMA)"),
    FeatureSpec("mma_k", "elements", "intrinsic K (1 for scalar FMA)"),
    FeatureSpec(
        "mma_area_to_volume",
        "1/element",
        "(mma_m*mma_k + mma_n*mma_k) / (mma_m*mma_n*mma_k), data moved per MMA work",
    ),
    FeatureSpec("subgroup_reuse", "elements", "vm*vn / (vm + vn), operand reuse of a subgroup tile"),
    FeatureSpec(
        "shared_memory_bytes", "bytes",
        "tb*(sa*tm*tk*a + sb*tn*tk*b); sa, sb = operand staged (0/1); attention adds the V "
        "block sb*tn*tv*b (tv = value head tile)",
    ),
    FeatureSpec("shared_memory_fraction", "fraction", "shared_memory_bytes / workgroup memory limit"),
    FeatureSpec(
        "acc_registers", "32-bit registers",
        "tb*tm*tn*c / 4 / threads, per thread (attention: f32 S block and output, "
        "tb*tm*(tn + tv) / threads)",
    ),
    FeatureSpec(
        "occupancy",
        "fraction",
        "resident subgroups / (SIMDs * 8); workgroups resident = min(by registers "
        "(acc_registers + 32 per thread), by shared memory, by thread slots)",
    ),
    FeatureSpec(
        "load_vector_bytes",
        "bytes",
        "(min(16, lvm*a) + min(16, lvn*b)) / 2, lvm/lvn = elements per vectorised load of A/B "
        "(default: 128-bit loads)",
    ),
    FeatureSpec("prefetch_stages", "count", "software pipelining stages (0/1 = none)"),
    # ---- CPU ----
    FeatureSpec(
        "cpu_vector_utilization",
        "fraction",
        "L / (ceil(L/V)*V), L = vn*c bytes, V = native vector bytes: used share of vector lanes",
    ),
    FeatureSpec(
        "cpu_vector_count_pow2",
        "flag",
        "1 if ceil(vn*c / V), the native vectors per register-tile row, is a power of two",
    ),
    FeatureSpec(
        "cpu_register_tile_fraction",
        "fraction",
        "vm * ceil(vn*c / V) / vector registers: accumulator registers vs register file",
    ),
    FeatureSpec(
        "cpu_l1_footprint_fraction",
        "fraction",
        "(vm*tk*a + tk*vn*b + vm*vn*c) / L1 bytes: register-tile working set",
    ),
    FeatureSpec(
        "cpu_l2_footprint_fraction",
        "fraction",
        "(tm*K*a + K*tn*b + tm*tn*c) / L2 bytes: workgroup panels over the whole K loop",
    ),
)

#: Ordered feature names: the schema learned models check.
FEATURE_NAMES: tuple[str, ...] = tuple(spec.name for spec in FEATURES)

__doc__ = (__doc__ or "") + "\n".join(
    f"- ``{spec.name}`` [{spec.unit}]: {spec.formula}" for spec in FEATURES
)


def feature_table_markdown() -> str:
    """The feature list as a markdown table (the source of docs/features.md)."""
    rows = [f"| `{s.name}` | {s.unit} | {s.formula} |" for s in FEATURES]
    return "\n".join(["| feature | unit | formula |", "|---|---|---|", *rows])


# ---- scalar context ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ProblemScalars:
    """Problem-level scalars the core needs (the GEMM view of any op)."""

    kind: str
    b: int
    m: int
    n: int
    k: int
    lhs_bytes: float
    rhs_bytes: float
    out_bytes: float
    flops: float

    @classmethod
    def from_problem(cls, problem: Problem) -> ProblemScalars:
        from dispatchtune.problem import element_bytes

        b, m, n, k = problem.gemm_shape
        types = problem.element_types
        return cls(
            kind=problem.kind,
            b=b,
            m=m,
            n=n,
            k=k,
            lhs_bytes=element_bytes(types[0]),
            rhs_bytes=element_bytes(types[1]),
            out_bytes=element_bytes(types[-1]),
            flops=float(problem.flops),
        )


@dataclass(frozen=True)
class TargetScalars:
    """Hardware scalars the core needs; CPU fields are 0 for GPUs and vice versa.

    `compute_units` is CUs/SMs on a GPU and cores on a CPU.
    """

    is_gpu: bool
    compute_units: int
    simds_per_cu: int = 0
    max_workgroup_memory_bytes: int = 0
    registers_per_simd: int = 0
    subgroup_size: int = 0
    native_vector_bytes: int = 0
    vector_registers: int = 0
    l1_bytes: int = 0
    l2_bytes: int = 0

    @classmethod
    def from_target(cls, target: Target) -> TargetScalars:
        if target.is_gpu:
            g = target.gpu_facts()
            return cls(
                is_gpu=True,
                compute_units=g.compute_units,
                simds_per_cu=g.simds_per_cu,
                max_workgroup_memory_bytes=g.max_workgroup_memory_bytes,
                registers_per_simd=g.registers_per_simd,
                subgroup_size=min(g.subgroup_sizes),
            )
        c = target.cpu_facts()
        return cls(
            is_gpu=False,
            compute_units=c.cores,
            native_vector_bytes=c.native_vector_bytes,
            vector_registers=c.vector_registers,
            l1_bytes=c.l1d_bytes,
            l2_bytes=c.l2_bytes,
        )


# ---- core -------------------------------------------------------------------------------------
Columns = Mapping[str, Any]

_KINDS = ("contraction", "convolution", "attention")


def _column(columns: Columns, name: str, n_rows: int, default: float) -> np.ndarray:
    """A float64 column; missing columns and NaN/0-for-unset entries take `default`."""
    if name not in columns:
        return np.full(n_rows, default, dtype=np.float64)
    values = np.asarray(columns[name], dtype=np.float64)
    if values.shape != (n_rows,):
        raise InputError(f"candidate column {name!r} has shape {values.shape}, expected ({n_rows},)")
    return np.where(np.isnan(values), default, values)


def _positive(columns: Columns, name: str, n_rows: int, default: float) -> np.ndarray:
    values = _column(columns, name, n_rows, default)
    return np.where(values > 0, values, default)


def compute_features(
    columns: Columns, problem: ProblemScalars, target: TargetScalars, n_rows: int | None = None
) -> dict[str, np.ndarray]:
    """Every feature of `FEATURES`, in order, as float64 arrays (one entry per candidate).

    `columns` maps candidate-table column names (`tile_m`, `vec_n`, `workgroup_threads`, ...) to
    arrays; optional extras understood here: `shared_lhs`/`shared_rhs` (operand staged in shared
    memory, default 1 on GPU), `load_vec_m`/`load_vec_n` (elements per vectorised global load,
    default 128-bit loads) and, for attention, `tile_v` (the value head dim tile).
    """
    if n_rows is None:
        if "tile_m" not in columns:
            raise InputError("candidate table has no 'tile_m' column")
        n_rows = len(columns["tile_m"])
    n = n_rows
    f64 = np.float64
    big_m, big_n, big_k, big_b = (float(max(v, 1)) for v in (problem.m, problem.n, problem.k, problem.b))
    a, b, c = problem.lhs_bytes, problem.rhs_bytes, problem.out_bytes
    units = float(max(target.compute_units, 1))

    tb = _positive(columns, "tile_b", n, 1.0)
    tm = _positive(columns, "tile_m", n, big_m)
    tn = _positive(columns, "tile_n", n, big_n)
    tk = _positive(columns, "tile_k", n, big_k)
    vm = _positive(columns, "vec_m", n, 1.0)
    vn = _positive(columns, "vec_n", n, 1.0)

    out: dict[str, np.ndarray] = {}
    full = np.full
    out["is_gpu"] = full(n, float(target.is_gpu), f64)
    for kind in _KINDS:
        out[f"kind_{kind}"] = full(n, float(problem.kind == kind), f64)
    out["problem_b"] = full(n, big_b, f64)
    out["problem_m"] = full(n, big_m, f64)
    out["problem_n"] = full(n, big_n, f64)
    out["problem_k"] = full(n, big_k, f64)
    out["lhs_bytes"] = full(n, a, f64)
    out["rhs_bytes"] = full(n, b, f64)
    out["out_bytes"] = full(n, c, f64)
    out["log2_flops"] = full(n, np.log2(max(problem.flops, 1.0)), f64)

    out["tile_b"] = tb
    out["tile_m"] = tm
    out["tile_n"] = tn
    out["tile_k"] = tk
    tk_int = tk.astype(np.int64)
    out["tile_k_pow2"] = ((tk_int & (tk_int - 1)) == 0).astype(f64)
    trips_m = np.ceil(big_m / tm)
    trips_n = np.ceil(big_n / tn)
    trips_k = np.ceil(big_k / tk)
    out["k_trips"] = trips_k
    out["tile_mn_ratio"] = np.minimum(tm, tn) / np.maximum(tm, tn)
    out["wg_area_to_volume"] = 1.0 / tn + 1.0 / tm
    out["wg_intensity"] = 2.0 * tm * tn / (tm * a + tn * b)
    workgroups = np.ceil(big_b / tb) * trips_m * trips_n
    if target.is_gpu and "workgroups" in columns:
        # GPU tables count workgroups over the loops IREE distributes (attention: B, M and the
        # value head dim, not the K2 block of the GEMM view).
        workgroups = np.where(
            (counted := _column(columns, "workgroups", n, 0.0)) > 0, counted, workgroups
        )
    out["workgroups"] = workgroups
    per_unit = workgroups / units
    out["workgroups_per_cu"] = per_unit
    waves = np.ceil(per_unit)
    out["wave_quantization"] = (waves - per_unit) / waves
    padded = (trips_m * tm) * (trips_n * tn) * (trips_k * tk)
    out["padding_waste"] = 1.0 - (big_m * big_n * big_k) / padded
    divides = (np.mod(big_m, tm) == 0) & (np.mod(big_n, tn) == 0) & (np.mod(big_k, tk) == 0)
    out["tile_divides_problem"] = divides.astype(f64)
    out["vec_m"] = vm
    out["vec_n"] = vn
    out["vec_divides_tile"] = ((np.mod(tm, vm) == 0) & (np.mod(tn, vn) == 0)).astype(f64)

    zeros = np.zeros(n, f64)
    if target.is_gpu:
        _gpu_features(out, columns, target, n, tb, tm, tn, tk, vm, vn, a, b, c,
                      problem.kind == "attention")
        for name in (
            "cpu_vector_utilization",
            "cpu_vector_count_pow2",
            "cpu_register_tile_fraction",
            "cpu_l1_footprint_fraction",
            "cpu_l2_footprint_fraction",
        ):
            out[name] = zeros
    else:
        for spec in FEATURES:
            if spec.name not in out and not spec.name.startswith("cpu_"):
                out[spec.name] = zeros
        out["threads"] = full(n, 1.0, f64)
        vbytes = float(max(target.native_vector_bytes, 1))
        row_bytes = vn * c
        vectors = np.ceil(row_bytes / vbytes)
        out["cpu_vector_utilization"] = row_bytes / (vectors * vbytes)
        count = vectors.astype(np.int64)
        out["cpu_vector_count_pow2"] = ((count & (count - 1)) == 0).astype(f64)
        out["cpu_register_tile_fraction"] = (
            vm * np.ceil(row_bytes / vbytes) / float(max(target.vector_registers, 1))
        )
        out["cpu_l1_footprint_fraction"] = (vm * tk * a + tk * vn * b + vm * vn * c) / float(
            max(target.l1_bytes, 1)
        )
        out["cpu_l2_footprint_fraction"] = (tm * big_k * a + big_k * tn * b + tm * tn * c) / float(
            max(target.l2_bytes, 1)
        )
    return {name: out[name] for name in FEATURE_NAMES}


def _gpu_features(
    out: dict[str, np.ndarray],
    columns: Columns,
    target: TargetScalars,
    n: int,
    tb: np.ndarray,
    tm: np.ndarray,
    tn: np.ndarray,
    tk: np.ndarray,
    vm: np.ndarray,
    vn: np.ndarray,
    a: float,
    b: float,
    c: float,
    attention: bool = False,
) -> None:
    simds = float(max(target.simds_per_cu, 1))
    sg_size = _positive(columns, "subgroup_size", n, float(max(target.subgroup_size, 1)))
    sg_m = _positive(columns, "subgroups_m", n, 1.0)
    sg_n = _positive(columns, "subgroups_n", n, 1.0)
    threads = _positive(columns, "workgroup_threads", n, 0.0)
    threads = np.where(threads > 0, threads, sg_m * sg_n * sg_size)
    subgroups = np.maximum(threads / sg_size, 1.0)
    out["threads"] = threads
    out["subgroup_size"] = sg_size
    out["subgroups"] = subgroups
    out["subgroups_per_simd"] = subgroups / simds
    out["subgroups_simd_multiple"] = (np.mod(subgroups, simds) == 0).astype(np.float64)
    mma_m = _positive(columns, "mma_m", n, 1.0)
    mma_n = _positive(columns, "mma_n", n, 1.0)
    mma_k = _positive(columns, "mma_k", n, 1.0)
    out["mma_m"] = mma_m
    out["mma_n"] = mma_n
    out["mma_k"] = mma_k
    out["mma_area_to_volume"] = 1.0 / mma_n + 1.0 / mma_m
    out["subgroup_reuse"] = vm * vn / (vm + vn)
    stage_a = _column(columns, "shared_lhs", n, 1.0)
    stage_b = _column(columns, "shared_rhs", n, 1.0)
    smem = tb * tk * (stage_a * tm * a + stage_b * tn * b)
    acc = tb * tm * tn * c / 4.0 / threads
    if attention:
        # Q (tm x K1), K (K2 block x K1) and V (K2 block x value tile tv) are staged (IREE
        # promotes all three); the S block (tm x K2 block) and the output (tm x tv) accumulate
        # in f32 registers.
        tv = _positive(columns, "tile_v", n, 0.0)
        tv = np.where(tv > 0, tv, tn)
        smem = tb * (tk * (stage_a * tm * a + stage_b * tn * b) + stage_b * tn * tv * b)
        acc = tb * tm * (tn + tv) / threads
    limit = float(max(target.max_workgroup_memory_bytes, 1))
    out["shared_memory_bytes"] = smem
    out["shared_memory_fraction"] = smem / limit
    out["acc_registers"] = acc
    # Resident workgroups per CU: the tightest of registers, shared memory and subgroup slots.
    slots = simds * MAX_SUBGROUPS_PER_SIMD
    sg_by_regs = np.floor(float(target.registers_per_simd) / (acc + REGISTER_OVERHEAD_PER_THREAD))
    wg_by_regs = np.floor(sg_by_regs * simds / subgroups)
    wg_by_smem = np.where(smem > 0, np.floor(limit / np.maximum(smem, 1.0)), np.inf)
    wg_by_slots = np.floor(slots / subgroups)
    resident = np.minimum(np.minimum(wg_by_regs, wg_by_smem), wg_by_slots)
    out["occupancy"] = np.clip(resident * subgroups / slots, 0.0, 1.0)
    load_a = _positive(columns, "load_vec_m", n, MAX_LOAD_BYTES / a) * a
    load_b = _positive(columns, "load_vec_n", n, MAX_LOAD_BYTES / b) * b
    out["load_vector_bytes"] = 0.5 * (np.minimum(load_a, MAX_LOAD_BYTES) + np.minimum(load_b, MAX_LOAD_BYTES))
    out["prefetch_stages"] = _column(columns, "prefetch_stages", n, 0.0)


# ---- table-level API --------------------------------------------------------------------------
def extract_features(problem: Problem, target: Target, table: pd.DataFrame) -> pd.DataFrame:
    """The feature table of a candidate table: columns `FEATURE_NAMES`, same index as `table`."""
    return features_frame(
        table, ProblemScalars.from_problem(problem), TargetScalars.from_target(target)
    )


def features_frame(
    table: pd.DataFrame, problem: ProblemScalars, target: TargetScalars
) -> pd.DataFrame:
    """`compute_features` over a DataFrame's columns, returned as a DataFrame (float64)."""
    if not isinstance(table, pd.DataFrame):
        raise InputError(f"expected a candidate DataFrame, got {type(table).__name__}")
    columns = {name: table[name].to_numpy() for name in table.columns if isinstance(name, str)}
    try:
        values = compute_features(columns, problem, target, n_rows=len(table))
    except (TypeError, ValueError) as exc:
        raise InputError(f"candidate table has a non-numeric tile column: {exc}") from exc
    return pd.DataFrame(values, index=table.index, copy=False)


def check_feature_schema(version: int, names: Sequence[str], where: str = "model") -> None:
    """Raise a one-line error unless (version, names) is this build's feature schema.

    Learned models store the schema they were trained on and call this when they are loaded.
    """
    if version != FEATURE_SCHEMA_VERSION or tuple(names) != FEATURE_NAMES:
        raise InputError(
            f"{where} was built for feature schema v{version} ({len(names)} features); this "
            f"dispatchtune computes v{FEATURE_SCHEMA_VERSION} ({len(FEATURE_NAMES)} features): "
            "retrain it"
        )


class FeatureExtractor(Protocol):
    """Turns candidate tables into feature tables; learned models check `schema_version`/names."""

    schema_version: int
    feature_names: tuple[str, ...]

    def extract(self, problem: Problem, target: Target, table: pd.DataFrame) -> pd.DataFrame: ...


class GemmFeatureExtractor:
    """The default extractor: the GEMM-view features of `FEATURES`."""

    schema_version: int = FEATURE_SCHEMA_VERSION
    feature_names: tuple[str, ...] = FEATURE_NAMES

    def extract(self, problem: Problem, target: Target, table: pd.DataFrame) -> pd.DataFrame:
        return extract_features(problem, target, table)
