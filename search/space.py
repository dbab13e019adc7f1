"""`CandidateSet`: every enumerated configuration of one problem on one target, as a table.

One row per candidate, in a deterministic order (RangeIndex 0..n-1). Columns and units:

Common to every row (int64 columns, except `pipeline`, a categorical of the four pipeline
names, and `intrinsic`, str)
    pipeline (str)        "DoubleTilingExpert" / "ConvTileAndDecomposeExpert" (llvm-cpu),
                          "TileAndFuse" / "VectorDistribute" (GPU).
    space (int)           which constraint set the row came from: the index of IREE's
                          `iree_codegen.smt.constraints` op in the dispatch (GPU; e.g. conv has a
                          direct and an IGEMM TileAndFuse set), 0 for CPU.
    tile_b (int)          batch elements per workgroup (GEMM-view B; >= 1).
    tile_m, tile_n (int)  elements of the GEMM-view M / N per workgroup. Convolutions: M = batch x
                          output image, N = output channels (implicit GEMM).
    tile_k (int)          elements of K consumed per reduction step. GPU: the reduction tile in
                          elements (TileAndFuse counts intrinsic-K units internally; converted
                          here: knob x mma_k). CPU: the `vector_reduction` tile (conv: over the
                          input channels, the filter loops being tiled to 1).
    vec_m, vec_n (int)    CPU: the `vector_common_parallel` tile along M / N. GPU: the tile one
                          subgroup computes, in elements (tile_m / subgroups_m, tile_n /
                          subgroups_n).
    workgroups (int)      number of workgroups launched: B/tile_b x ceil(M/tile_m) x ceil(N/tile_n).
    igemm (int)           1 when a GPU conv is lowered as implicit GEMM (IREE's
                          `use_igemm_convolution`), else 0.
    tile_oh, tile_ow (int)  convolutions: workgroup tile of the output height / width loops in
                          elements when the loop space has them (CPU conv, GPU direct conv), else 0.
    vec_ow (int)          CPU conv: `vector_common_parallel` tile of the output width, else 0.

GPU rows (CPU rows hold "" / 0)
    intrinsic (str)       MMA intrinsic, e.g. "MFMA_F32_16x16x16_F16".
    mma_m, mma_n, mma_k (int)  the intrinsic's shape in elements.
    subgroups_m, subgroups_n (int)  subgroups (waves / warps) per workgroup along M / N.
    subgroup_size (int)   threads per subgroup (64 on CDNA, 32/64 on RDNA, 32 on NVIDIA).
    workgroup_threads (int)  threads per workgroup (product of `workgroup_size`).
    prefetch_stages (int)  `prefetch_num_stages` of the GPU pipeline options.
    waves_per_eu (int)    AMD occupancy hint `amdgpu-waves-per-eu` when enumerated as an extra
                          knob (`extra_knobs={"waves_per_eu": ...}`); 0 = compiler default.

GPU-only columns (absent from CPU tables; `search.gpu.gpu_columns`)
    operand_bits (int)    bits a lane reads contiguously per element vector of the intrinsic's
                          A operand (IREE's layout; virtual intrinsics differ from native ones).
    tile_v (int)          attention: workgroup tile of the value head dim (N of P x V).
    pv_intrinsic (str)    attention: the P x V intrinsic (`intrinsic` is the Q x K^T one).
    p_relayout (int)      attention: 1 when P, the Q x K^T result, must change layout across
                          lanes before P x V reads it; 0 when it stays in registers as it is.
    qk_recompute (int)    attention: ceil(value head dim / tile_v), how many workgroups compute
                          the same Q x K^T block and softmax (one per slice of the value head).

Raw knobs (int)
    knob_<name>           GPU: IREE's knob values exactly as its constraints name them (`wg_0`,
                          `red_2`, `sg_m_cnt`, `mma_idx`, ...); they are what
                          `materialize_compilation_info` takes. -1 where a row's constraint set
                          has no such knob (after concatenating pipelines).
                          CPU: `knob_distribution_<i>`, `knob_vector_common_parallel_<i>`,
                          `knob_vector_reduction_<i>`, one per loop i of the op, the exact lists
                          of `#iree_cpu.lowering_config`.

`compilation_info(i)` returns row i's `#iree_codegen.compilation_info<...>` text; GPU rows are
materialised on demand by IREE from the constraints op and the row's knobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from dispatchtune.problem import Problem
from dispatchtune.targets import Target

#: Columns every candidate table has, in this order (GPU-only ones are ""/0 on CPU rows).
COLUMNS: tuple[str, ...] = (
    "pipeline", "space", "tile_b", "tile_m", "tile_n", "tile_k", "vec_m", "vec_n", "workgroups",
    "intrinsic", "mma_m", "mma_n", "mma_k", "subgroups_m", "subgroups_n", "subgroup_size",
    "workgroup_threads", "prefetch_stages", "waves_per_eu", "igemm", "tile_oh", "tile_ow",
    "vec_ow",
)
STRING_COLUMNS = ("pipeline", "intrinsic", "pv_intrinsic")
CPU_PIPELINES = ("DoubleTilingExpert", "ConvTileAndDecomposeExpert", "LinalgExtTileAndVectorize")
GPU_PIPELINES = ("TileAndFuse", "VectorDistribute")


class Materializer(Protocol):
    """Turns rows of a candidate table into `compilation_info` text."""

    def compilation_info(self, row: pd.Series) -> str: ...

    def compilation_infos(self, rows: pd.DataFrame) -> list[str]:
        """The text of many rows at once, in their order (a whole ranked space: batch it)."""
        ...


def finish_table(columns: dict[str, Any], rows: int) -> pd.DataFrame:
    """A table with every standard column (missing ones filled with ""/0) in the standard order,
    followed by the knob columns in the given order."""
    data: dict[str, Any] = {}
    for name in COLUMNS:
        if name in columns:
            data[name] = columns[name]
        elif name in STRING_COLUMNS:
            data[name] = np.full(rows, "", dtype=object)
        else:
            data[name] = np.zeros(rows, dtype=np.int64)
    for name, values in columns.items():
        if name not in data:
            data[name] = values
    table = pd.DataFrame(data)
    for name in table.columns:
        table[name] = _typed(table[name], name)
    return table


def _typed(column: pd.Series, name: str) -> pd.Series:
    if name == "pipeline":
        # Fixed categories: the dtype does not depend on which pipelines a table holds.
        return column.astype(pd.CategoricalDtype([*CPU_PIPELINES, *GPU_PIPELINES]))
    if name in STRING_COLUMNS:
        return column.astype(object)
    return column.astype(np.int64)


@dataclass
class CandidateSet:
    """All candidates of one problem on one target (see the module docstring for the columns)."""

    problem: Problem
    target: Target
    table: pd.DataFrame
    materializers: dict[str, Materializer] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.table)

    def compilation_info(self, i: int) -> str:
        """`#iree_codegen.compilation_info<...>` text of row i (GPU rows: materialised by IREE)."""
        if not 0 <= i < len(self.table):
            raise IndexError(f"candidate {i} out of range (0..{len(self.table) - 1})")
        row = self.table.iloc[i]
        return self.materializers[str(row["pipeline"])].compilation_info(row)

    def digest(self) -> str:
        """Identity of this enumeration: results name their candidates by row (`candidate_id`), and
        another IREE, Z3 model or CPU numbers the rows differently. Cheap: hashes the table, not
        the MLIR strings."""
        import hashlib

        table = self.table.reset_index(drop=True)
        hashed = pd.util.hash_pandas_object(table, index=True).to_numpy()
        digest = hashlib.sha256(f"{self.problem.key}@{self.target.name}:{len(table)}".encode())
        digest.update(hashed.tobytes())
        return digest.hexdigest()[:16]

    def compilation_infos(self, rows: Sequence[int] | None = None) -> list[str]:
        """`compilation_info` text of the given rows (all rows by default), in that order; one
        batch per pipeline (per-row access would dominate a 59,000-row GPU space)."""
        ids = np.arange(len(self.table)) if rows is None else np.asarray(rows, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.table)):
            raise IndexError(f"candidate rows out of range (0..{len(self.table) - 1})")
        subset = self.table.iloc[ids]
        pipelines = subset["pipeline"].astype(str).to_numpy()
        texts: list[str] = [""] * len(ids)
        for pipeline in dict.fromkeys(pipelines.tolist()):
            positions = np.flatnonzero(pipelines == pipeline)
            batch = self.materializers[pipeline].compilation_infos(subset.iloc[positions])
            for position, text in zip(positions.tolist(), batch, strict=True):
                texts[position] = text
        return texts

    def head(self, n: int) -> CandidateSet:
        """The first n candidates (same order)."""
        table = self.table.iloc[:n].reset_index(drop=True)
        return CandidateSet(self.problem, self.target, table, self.materializers)

    def take(self, rows: Sequence[int]) -> CandidateSet:
        """A subset in the given order (e.g. a cost model's ranking)."""
        table = self.table.iloc[list(rows)].reset_index(drop=True)
        return CandidateSet(self.problem, self.target, table, self.materializers)

    @classmethod
    def concat(cls, sets: Sequence[CandidateSet]) -> CandidateSet:
        """Rows of several sets of the same problem and target, in order (e.g. two pipelines).

        Knob columns absent from some set are filled with -1 ("no such knob").
        """
        if not sets:
            raise ValueError("concat needs at least one CandidateSet")
        first = sets[0]
        for other in sets[1:]:
            if other.problem != first.problem or other.target != first.target:
                raise ValueError("concat needs sets of the same problem and target")
        materializers: dict[str, Materializer] = {}
        for s in sets:
            materializers.update(s.materializers)
        tables = [s.table for s in sets if len(s.table.columns)]
        table = pd.concat(tables, ignore_index=True) if tables else first.table
        for name in table.columns:
            if name.startswith("knob_"):
                table[name] = table[name].fillna(-1)
            table[name] = _typed(table[name], name)
        return cls(first.problem, first.target, table.reset_index(drop=True), materializers)
