"""`HeuristicModel`: a handwritten, interpretable score over the common features.

The score is a sum of terms, each the logarithm of an efficiency factor in (0, 1]: a candidate that
loses 20% of its work to padding gets log(0.8) from the padding term. Summing logs multiplies the
factors, so the score reads as "log of the predicted fraction of peak throughput", and every term
can be read (and switched off) on its own. `term_scores` shows each term's contribution per row.

The terms, their formulas and the reason for each are listed in `GPU_TERMS` / `CPU_TERMS` and in
docs/heuristic.md; tests check that every term changes the order of some candidate set (the
reference tool's key had two terms that could never change anything).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dispatchtune.costmodel.base import CostModel
from dispatchtune.errors import InputError

#: Workgroup-tile arithmetic intensity (FLOP per byte loaded from global memory) at which a GEMM
#: tile stops being limited by DRAM/L2 bandwidth on current GPUs (peak FLOP/s over DRAM bytes/s is
#: about 20-40 on RTX 20xx/A100/MI300).
GPU_RIDGE_FLOP_PER_BYTE = 32.0
#: Accumulators per thread (32-bit registers) from which register-level operand reuse saturates.
GPU_ACC_REGISTERS_GOOD = 128.0
#: Occupancy (resident subgroups / slots) that suffices to hide memory latency in a GEMM main loop.
GPU_OCCUPANCY_GOOD = 0.25
#: Architectural 32-bit registers one thread can address (NVIDIA 255, AMD 256 arch VGPRs).
GPU_MAX_REGISTERS_PER_THREAD = 256.0
#: Register-overhead constant shared with the occupancy feature (addresses, loop state, operands).
GPU_REGISTER_OVERHEAD = 32.0
#: Widest per-thread global load (bytes).
GPU_WIDEST_LOAD = 16.0
#: Largest intrinsic data reuse considered (1 / area-to-volume of a 32x32 intrinsic).
GPU_MMA_REUSE_GOOD = 16.0
#: CPU: share of the vector register file the accumulators should fill to hide FMA latency.
CPU_REGISTER_FILL_GOOD = 0.25
#: CPU: share above which accumulators plus operands no longer fit and spill.
CPU_REGISTER_SPILL = 0.75
#: CPU: register-tile rows from which each loaded RHS vector is reused enough (the 8 independent
#: accumulators FMA latency x throughput needs; 4 until docs/heuristic.md "rhs_reuse saturates").
CPU_RHS_REUSE_ROWS = 8.0
#: Floor of every efficiency factor, so an impossible candidate sorts last without -inf.
_FLOOR = 1e-6


def _log(x: Any) -> np.ndarray:
    return np.log(np.clip(np.asarray(x, dtype=np.float64), _FLOOR, 1.0))


def _flag_penalty(flag: pd.Series, factor: float) -> np.ndarray:
    """log(factor) where the flag is 0, else 0."""
    return np.where(flag.to_numpy() > 0, 0.0, np.log(factor))


@dataclass(frozen=True)
class HeuristicTerm:
    """One additive term: log of an efficiency factor, with the reason it exists."""

    name: str
    formula: str
    reason: str
    fn: Callable[[pd.DataFrame], np.ndarray]


_PADDING = HeuristicTerm(
    "padding",
    "log(1 - padding_waste)",
    "Tiles that do not divide the problem compute padded elements; that work is pure waste.",
    lambda f: _log(1.0 - f["padding_waste"]),
)
_WAVES = HeuristicTerm(
    "wave_quantization",
    "log(1 - wave_quantization)",
    "When W workgroups are not a multiple of the U compute units, the last wave leaves units "
    "idle; the idle share is (ceil(W/U) - W/U) / ceil(W/U).",
    lambda f: _log(1.0 - f["wave_quantization"]),
)

GPU_TERMS: tuple[HeuristicTerm, ...] = (
    _PADDING,
    _WAVES,
    HeuristicTerm(
        "tile_intensity",
        f"log(min(1, wg_intensity / {GPU_RIDGE_FLOP_PER_BYTE:g}))",
        "A workgroup tile loads (tm + tn) * tk elements for tm * tn * tk MACs; below the ridge "
        "point of the memory system the kernel is bandwidth-bound in proportion.",
        lambda f: _log(f["wg_intensity"] / GPU_RIDGE_FLOP_PER_BYTE),
    ),
    HeuristicTerm(
        "register_reuse",
        f"0.5 * log(min(1, acc_registers / {GPU_ACC_REGISTERS_GOOD:g}))",
        "Each thread reuses every operand it loads from shared memory across its accumulators; "
        "few accumulators per thread make the kernel shared-memory/issue bound. Half weight: "
        "the effect saturates gradually.",
        lambda f: 0.5 * _log(f["acc_registers"] / GPU_ACC_REGISTERS_GOOD),
    ),
    HeuristicTerm(
        "register_spill",
        f"2 * log(min(1, {GPU_MAX_REGISTERS_PER_THREAD:g} / (acc_registers + "
        f"{GPU_REGISTER_OVERHEAD:g})))",
        "Accumulators beyond the per-thread register limit spill to scratch memory, which costs "
        "far more than the reuse they buy (hence weight 2).",
        lambda f: 2.0
        * _log(GPU_MAX_REGISTERS_PER_THREAD / (f["acc_registers"] + GPU_REGISTER_OVERHEAD)),
    ),
    HeuristicTerm(
        "occupancy",
        f"log(min(1, occupancy / {GPU_OCCUPANCY_GOOD:g}))",
        "Resident subgroups hide global/shared-memory latency; below about a quarter of the "
        "slots (registers or shared memory limit residency) latency is exposed. A candidate that "
        "does not fit at all (occupancy 0) sorts last.",
        lambda f: _log(f["occupancy"] / GPU_OCCUPANCY_GOOD),
    ),
    HeuristicTerm(
        "vector_loads",
        f"0.5 * log(min(1, load_vector_bytes / {GPU_WIDEST_LOAD:g}))",
        "Narrow global loads issue more memory instructions per byte; 128-bit loads are the "
        "widest. Half weight: caches coalesce part of the loss.",
        lambda f: 0.5 * _log(f["load_vector_bytes"] / GPU_WIDEST_LOAD),
    ),
    HeuristicTerm(
        "simd_multiple",
        "log(0.9) if subgroups % SIMDs-per-CU != 0 else 0",
        "A workgroup whose subgroup count is not a multiple of the SIMDs per CU leaves SIMDs "
        "unevenly loaded (term kept from the reference tool, where it was effective).",
        lambda f: _flag_penalty(f["subgroups_simd_multiple"], 0.9),
    ),
    HeuristicTerm(
        "tile_k_pow2",
        "log(0.9) if tile_k is not a power of two else 0",
        "Non-power-of-two K steps split into uneven intrinsic/vector chunks and misalign shared "
        "memory rows (term kept from the reference tool).",
        lambda f: _flag_penalty(f["tile_k_pow2"], 0.9),
    ),
    HeuristicTerm(
        "mma_reuse",
        f"0.25 * log(min(1, 1 / (mma_area_to_volume * {GPU_MMA_REUSE_GOOD:g})))",
        "Larger intrinsics move less data per MAC between registers and the matrix unit "
        "((m*k + n*k) / (m*n*k)); quarter weight: the subgroup tile already reuses operands.",
        lambda f: 0.25 * _log(1.0 / (f["mma_area_to_volume"] * GPU_MMA_REUSE_GOOD)),
    ),
)

CPU_TERMS: tuple[HeuristicTerm, ...] = (
    _PADDING,
    HeuristicTerm(
        "tile_remainder",
        "log(0.25) if a workgroup tile does not divide the problem else 0",
        "llvm-cpu peels non-dividing tiles into slow remainder loops: measured 7x slower for a "
        "100x100 distribution of a 512^3 matmul, far beyond the padded work alone.",
        lambda f: _flag_penalty(f["tile_divides_problem"], 0.25),
    ),
    HeuristicTerm(
        "vector_remainder",
        "log(0.4) if the register tile does not divide the workgroup tile else 0",
        "A register tile that does not divide the workgroup tile leaves a masked/scalar remainder "
        "(measured 2.5x slower for vec 6 over tile 128).",
        lambda f: _flag_penalty(f["vec_divides_tile"], 0.4),
    ),
    HeuristicTerm(
        "register_fill",
        f"log(min(1, cpu_register_tile_fraction / {CPU_REGISTER_FILL_GOOD:g}))",
        "FMA latency x throughput needs about 8 independent accumulator registers; a 1x16 or 2x8 "
        "register tile ran 6x slower than 8x16 on this machine.",
        lambda f: _log(f["cpu_register_tile_fraction"] / CPU_REGISTER_FILL_GOOD),
    ),
    HeuristicTerm(
        "register_spill",
        f"2 * log(min(1, {CPU_REGISTER_SPILL:g} / cpu_register_tile_fraction))",
        "Accumulators must leave registers for the operand vectors; beyond three quarters of the "
        "register file the tile spills to the stack in the inner loop.",
        lambda f: 2.0 * _log(CPU_REGISTER_SPILL / f["cpu_register_tile_fraction"]),
    ),
    HeuristicTerm(
        "vector_pow2",
        "log(0.2) if the native vectors per register-tile row are not a power of two else 0",
        "A register-tile row of 3, 6, 12 or 24 native vectors (vec_n 48, 96, 192, 384 f32 on "
        "AVX-512) is a non-power-of-two LLVM vector type that is legalised by splitting; such "
        "tiles ran 3-20x slower than the best in a random sample of this machine's space.",
        lambda f: _flag_penalty(f["cpu_vector_count_pow2"], 0.2),
    ),
    HeuristicTerm(
        "rhs_reuse",
        f"0.5 * log(min(1, vec_m / {CPU_RHS_REUSE_ROWS:g}))",
        "Each RHS vector loaded in the inner loop feeds vec_m FMAs; with one or two rows the loop "
        "streams the RHS panel at one or two FMAs per load and becomes load-bound (1-row tiles "
        "ran about 2x slower than 8-row ones with the same accumulator count).",
        lambda f: 0.5 * _log(f["vec_m"] / CPU_RHS_REUSE_ROWS),
    ),
    HeuristicTerm(
        "vector_utilization",
        "log(cpu_vector_utilization)",
        "Vector lanes beyond vec_n * element bytes in the last native vector are wasted.",
        lambda f: _log(f["cpu_vector_utilization"]),
    ),
    HeuristicTerm(
        "parallelism",
        "log(min(1, workgroups_per_cu))",
        "With fewer workgroups than cores some cores idle for the whole dispatch.",
        lambda f: _log(f["workgroups_per_cu"]),
    ),
    _WAVES,
    HeuristicTerm(
        "l1_footprint",
        "log(min(1, 1 / cpu_l1_footprint_fraction))",
        "The register tile's operands and accumulators are re-read every K step; beyond L1 they "
        "come from L2 at a fraction of the bandwidth.",
        lambda f: _log(1.0 / f["cpu_l1_footprint_fraction"]),
    ),
    HeuristicTerm(
        "l2_footprint",
        "0.5 * log(min(1, 1 / cpu_l2_footprint_fraction))",
        "A workgroup's LHS/RHS panels over the K loop are reused across its register tiles; "
        "beyond L2 they stream from L3/DRAM. Half weight: hardware prefetch hides part of it.",
        lambda f: 0.5 * _log(1.0 / f["cpu_l2_footprint_fraction"]),
    ),
)


def terms_for(features: pd.DataFrame) -> tuple[HeuristicTerm, ...]:
    """The GPU or CPU term set, chosen by the table's `is_gpu` feature."""
    if "is_gpu" not in features:
        raise InputError("feature table has no 'is_gpu' column; build it with extract_features")
    if len(features) and bool(features["is_gpu"].iloc[0]):
        return GPU_TERMS
    return CPU_TERMS


class HeuristicModel(CostModel):
    """Sum of handwritten log-efficiency terms (see the module doc); `disabled` drops terms.

    `fit` learns nothing: the model is handwritten, so it ignores its data and returns self.
    """

    def __init__(self, disabled: Iterable[str] = ()) -> None:
        self.disabled = frozenset(disabled)
        known = {t.name for t in (*GPU_TERMS, *CPU_TERMS)}
        unknown = self.disabled - known
        if unknown:
            raise InputError(f"unknown heuristic term(s): {', '.join(sorted(unknown))}")

    def fit(self, features: pd.DataFrame, labels: Any, groups: Any = None) -> HeuristicModel:
        return self

    def term_scores(self, features: pd.DataFrame) -> pd.DataFrame:
        """Each enabled term's contribution per row (columns = term names)."""
        missing_ok = len(features) == 0
        values: dict[str, np.ndarray] = {}
        for term in terms_for(features):
            if term.name in self.disabled:
                continue
            try:
                values[term.name] = np.asarray(term.fn(features), dtype=np.float64)
            except KeyError as exc:
                if missing_ok:
                    values[term.name] = np.zeros(0)
                    continue
                raise InputError(f"feature table lacks {exc} needed by term {term.name!r}") from exc
        return pd.DataFrame(values, index=features.index)

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        scores = self.term_scores(features).sum(axis=1).to_numpy(dtype=np.float64)
        # Round away float noise so that equal-by-construction candidates tie exactly.
        return np.round(scores, 9)
