"""GPU search spaces from IREE's own SMT constraints (TileAndFuse, VectorDistribute).

`iree-compile --iree-codegen-emit-pipeline-constraints --compile-to=executable-configurations`
attaches one `iree_codegen.smt.constraints` op per candidate pipeline (and, for convolutions, per
lowering: direct and implicit GEMM) to the dispatch. Each op carries a knob template (which
lowering-config entry is which knob) and a body of SMT assertions. We convert the body to
SMT-LIB (`convert_constraints_op_to_smtlib`), enumerate every solution exactly with
`engine.ConstraintSystem`, and turn a row back into a `compilation_info` with IREE's
`materialize_compilation_info` (lazily, per row).

The constraints come from `gpu_source` (which op to ask IREE, and the configured module that
carries them) and are read into `GpuSpace`s by `gpu_space` (knob templates, loops IREE's
constraints leave out, heuristic filters, `violated_constraints`), with the intrinsics'
shapes and layouts from `gpu_intrinsics`. This module enumerates a space (`enumerate_space`),
turns its rows into candidate-table columns (`gpu_columns`) and back into `compilation_info`
(`GpuMaterializer`), and finds IREE's own configuration among them (`default_match`).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dispatchtune.candidate import DECOMPOSITION_KEY, with_decomposition
from dispatchtune.errors import DispatchTuneError, UnsupportedProblem
from dispatchtune.problem import Problem
from dispatchtune.search.engine import enumerate_blocking
from dispatchtune.search.gpu_source import collapsed_loops, constraint_source, constraints_module
from dispatchtune.search.gpu_space import Entry, GpuSpace, constraint_ops, gpu_spaces, insert_at
from dispatchtune.search.space import GPU_PIPELINES, CandidateSet, finish_table
from dispatchtune.targets import Target

logger = logging.getLogger(__name__)


def with_batch_tiles(info: Any, loops: Sequence[int]) -> Any:
    """A batch-less problem's `compilation_info` for the full problem: batch tile 1 inserted.

    `workgroup` gets 1, `reduction` and TileAndFuse `subgroup` 0, and `subgroup_basis` one
    subgroup along each batch loop (its mapping renumbered), as IREE's default batch configs.
    """
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen, iree_gpu

    info = iree_codegen.CompilationInfoAttr(info)
    config = iree_gpu.LoweringConfigAttr(info.lowering_config).attributes
    entries = {config[i].name: config[i].attr for i in range(len(config))}
    i64 = ir.IntegerType.get_signless(64)

    def ints(values: Sequence[int]) -> Any:
        return ir.ArrayAttr.get([ir.IntegerAttr.get(i64, int(v)) for v in values])

    def values(attr: Any) -> list[int]:
        return [int(ir.IntegerAttr(a).value) for a in ir.ArrayAttr(attr)]

    for key, filler in (("workgroup", 1), ("reduction", 0), ("subgroup", 0)):
        if key in entries:
            entries[key] = ints(insert_at(values(entries[key]), loops, filler))
    if "subgroup_basis" in entries:
        entries["subgroup_basis"] = _basis_with_loops(entries["subgroup_basis"], loops)
    lowering = iree_gpu.LoweringConfigAttr.get(ir.DictAttr.get(entries))
    return iree_codegen.CompilationInfoAttr.get(lowering, info.translation_info)


def _basis_with_loops(basis: Any, loops: Sequence[int]) -> Any:
    """A `subgroup_basis` ([counts, mapping]) with one subgroup along each inserted loop.

    Counts have one entry per loop of the op; the mapping lists, in loop order, the basis entry
    of each loop the config covers (all loops of a contraction; one matmul's loops of an
    attention), so an inserted loop goes after the entries below it.
    """
    from iree.compiler import ir

    i64 = ir.IntegerType.get_signless(64)
    counts_attr, mapping_attr = list(ir.ArrayAttr(basis))
    counts = [int(ir.IntegerAttr(a).value) for a in ir.ArrayAttr(counts_attr)]
    mapping = [int(ir.IntegerAttr(a).value) for a in ir.ArrayAttr(mapping_attr)]
    for loop in sorted(loops):  # basis entries at or after `loop` move up by one
        counts.insert(loop, 1)
        mapping = [m + (m >= loop) for m in mapping]
        mapping.insert(sum(m < loop for m in mapping), loop)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, v) for v in row])
                             for row in (counts, mapping)])


# ---- enumeration --------------------------------------------------------------------------------
def enumerate_space(space: GpuSpace, limit: int | None = None) -> pd.DataFrame:
    """Every solution of one constraint set as a candidate table (deduplicated on the knobs)."""
    system = space.system()
    names = list(system.variables)
    parts: list[pd.DataFrame] = []
    kept = 0
    for chunk in system.solve():
        part = pd.DataFrame({n: chunk[n] for n in names})
        parts.append(part)
        kept += len(part)
        if limit is not None and kept >= limit:
            # Auxiliary SMT variables could repeat a knob assignment: count distinct ones.
            merged = pd.concat(parts, ignore_index=True)
            kept = int((~merged[list(space.knobs)].duplicated()).sum()) if len(space.knobs) else 0
            parts = [merged]
            if kept >= limit:
                break
    if parts:
        solutions = pd.concat(parts, ignore_index=True)
    else:
        solutions = pd.DataFrame({n: np.zeros(0, dtype=np.int64) for n in names})
    solutions = solutions[~solutions[list(space.knobs)].duplicated()]
    cols = {n: solutions[n].to_numpy(dtype=np.int64) for n in names}
    table = gpu_columns(space, cols)
    if limit is not None:
        table = table.iloc[:limit].reset_index(drop=True)
    return table


def reference_solutions(space: GpuSpace) -> set[tuple[int, ...]]:
    """The same solution set by blocking clauses (slow; for tests and benchmarks)."""
    import z3

    return set(enumerate_blocking(list(z3.parse_smt2_string(space.smtlib)), space.knobs))


def gpu_columns(space: GpuSpace, cols: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """Standard candidate columns (elements, counts) from IREE's raw knob values."""
    rows = len(next(iter(cols.values()))) if cols else 0

    def value(entry: Entry) -> np.ndarray:
        if isinstance(entry, str):
            return np.asarray(cols[entry], dtype=np.int64)
        return np.full(rows, entry, dtype=np.int64)

    def option(values: Sequence[Any], index: np.ndarray, default: Any, dtype: Any) -> np.ndarray:
        """Per row, the option `index` picks (`default` when the template offers none)."""
        table = np.array(values or [default], dtype=dtype)
        return table[np.clip(index, 0, len(table) - 1)]

    knob = space.mma_knob
    mma_idx = value(knob) if knob in cols else np.zeros(rows, dtype=np.int64)
    mma = option(space.mma_shapes, mma_idx, (0, 0, 0), np.int64)
    bounds = space.loop_bounds

    def tile(
        entries: tuple[Entry, ...], loops: tuple[int, ...], scale_knobs: np.ndarray | None
    ) -> np.ndarray:
        out = np.ones(rows, dtype=np.int64)
        for loop in loops:
            size = value(entries[loop])
            size = np.where(size == 0, bounds[loop], size)  # 0 = not tiled: the whole loop
            if scale_knobs is not None and isinstance(entries[loop], str):
                size = size * scale_knobs
            out *= size
        return out

    extra: dict[str, np.ndarray] = {}
    if space.kind == "attention":
        gemm_view, value_head = _attention_tiles(space, value, rows)
        tile_b, tile_m, tile_n, tile_k, vec_m, vec_n, sub_m, sub_n, workgroups = gemm_view
        extra.update(value_head)
        pv_idx = value(space.pv_knob) if space.pv_knob in cols else np.zeros(rows, np.int64)
        extra["pv_intrinsic"] = option(space.pv_intrinsics, pv_idx, "", object)
        relayout = np.array(space.p_relayout or [[1]], dtype=np.int64)
        extra["p_relayout"] = relayout[np.clip(mma_idx, 0, len(relayout) - 1),
                                       np.clip(pv_idx, 0, relayout.shape[1] - 1)]
    else:
        k_scale = mma[:, 2] if space.pipeline == "TileAndFuse" else None
        tile_b = tile(space.workgroup, space.classes["b"], None)
        tile_m = tile(space.workgroup, space.classes["m"], None)
        tile_n = tile(space.workgroup, space.classes["n"], None)
        tile_k = tile(space.reduction, space.classes["k"], k_scale)
        if space.subgroup:
            # TileAndFuse states per-subgroup tiles; the innermost M/N loop counts in intrinsics.
            vec_m = _subgroup_tile(space.subgroup, space.classes["m"], mma[:, 0], value, rows)
            vec_n = _subgroup_tile(space.subgroup, space.classes["n"], mma[:, 1], value, rows)
            sub_m = np.maximum(tile_m // np.maximum(vec_m, 1), 1)
            sub_n = np.maximum(tile_n // np.maximum(vec_n, 1), 1)
        else:
            sub_m = value("sg_m_cnt") if "sg_m_cnt" in cols else np.ones(rows, dtype=np.int64)
            sub_n = value("sg_n_cnt") if "sg_n_cnt" in cols else np.ones(rows, dtype=np.int64)
            vec_m = tile_m // np.maximum(sub_m, 1)
            vec_n = tile_n // np.maximum(sub_n, 1)
        size_b = math.prod(bounds[i] for i in space.classes["b"])
        size_m = math.prod(bounds[i] for i in space.classes["m"])
        size_n = math.prod(bounds[i] for i in space.classes["n"])
        workgroups = (size_b // np.maximum(tile_b, 1)) * -(-size_m // tile_m) * -(-size_n // tile_n)
    threads = np.ones(rows, dtype=np.int64)
    for name in ("wg_size_x", "wg_size_y", "wg_size_z"):
        if name in cols:
            threads = threads * value(name)
    stages = (
        value("prefetch_num_stages") if "prefetch_num_stages" in cols
        else np.full(rows, space.fixed.get("prefetch_num_stages", 0), dtype=np.int64)
    )
    intrinsic = option(space.intrinsics, mma_idx, "", object)
    image = space.image_loops
    zeros = np.zeros(rows, dtype=np.int64)
    columns: dict[str, Any] = {
        "pipeline": np.full(rows, space.pipeline, dtype=object),
        "space": np.full(rows, space.index, dtype=np.int64),
        "tile_b": tile_b, "tile_m": tile_m, "tile_n": tile_n, "tile_k": tile_k,
        "vec_m": vec_m, "vec_n": vec_n,
        "workgroups": workgroups,
        "intrinsic": intrinsic, "mma_m": mma[:, 0], "mma_n": mma[:, 1], "mma_k": mma[:, 2],
        "operand_bits": option(space.operand_bits, mma_idx, 0, np.int64),
        "subgroups_m": sub_m, "subgroups_n": sub_n,
        "subgroup_size": value("sg_size") if "sg_size" in cols else np.zeros(rows, np.int64),
        "workgroup_threads": threads, "prefetch_stages": stages,
        "igemm": np.full(rows, int(space.igemm), dtype=np.int64),
        "tile_oh": tile(space.workgroup, image[:1], None) if len(image) == 2 else zeros,
        "tile_ow": tile(space.workgroup, image[1:], None) if len(image) == 2 else zeros,
    }
    columns.update(extra)
    for knob in space.knobs:
        columns[f"knob_{knob}"] = value(knob)
    return finish_table(columns, rows)


def _attention_tiles(
    space: GpuSpace, value: Any, rows: int
) -> tuple[tuple[np.ndarray, ...], dict[str, np.ndarray]]:
    """Tiles of an attention row in its Q x K^T GEMM view (M = m, N = K2, K = K1, as the features),
    and the value head dim columns outside that view (`tile_v`, `qk_recompute`).

    A workgroup owns `m_tile` query rows and `n_tile` value columns; each reduction step reads a
    K2 block of `red_k2` keys (the Q x K^T tile's N) against all of K1 (never tiled). Workgroups
    are counted over batch, M and the value head dim N, the loops IREE distributes.
    """
    bounds = space.loop_bounds

    def tile(entries: tuple[Entry, ...], loops: tuple[int, ...]) -> np.ndarray:
        out = np.ones(rows, dtype=np.int64)
        for loop in loops:
            size = value(entries[loop])
            out *= np.where(size == 0, bounds[loop], size)  # 0 = not tiled: the whole loop
        return out

    classes = space.classes
    tile_b = tile(space.workgroup, classes["b"])
    tile_m = tile(space.workgroup, classes["m"])
    tile_v = tile(space.workgroup, classes["n"])
    tile_n = tile(space.reduction, classes["k2"])
    tile_k = np.full(rows, math.prod(bounds[i] for i in classes["k1"]), dtype=np.int64)
    # Subgroups split M (and the value head dim N, `sg_n_cnt`, which IREE fixes to 1).
    # Counts are per loop of the op (IREE's basis for attention has one entry per loop).
    counts = space.subgroup_counts
    sub_m = value(counts[classes["m"][-1]] if counts else 1)
    sub_n = value(counts[classes["n"][-1]] if counts else 1)
    size = {c: math.prod(bounds[i] for i in classes[c]) for c in ("b", "m", "n")}
    # Workgroups that split the value head dim each compute the same Q x K^T block and its
    # softmax again: that work is done this many times over.
    qk_recompute = -(-size["n"] // np.maximum(tile_v, 1))
    workgroups = -(-size["b"] // tile_b) * -(-size["m"] // tile_m) * qk_recompute
    vec_m = tile_m // np.maximum(sub_m, 1)
    vec_n = tile_n // np.maximum(sub_n, 1)
    gemm_view = (tile_b, tile_m, tile_n, tile_k, vec_m, vec_n, sub_m, sub_n, workgroups)
    return gemm_view, {"tile_v": tile_v, "qk_recompute": qk_recompute}


def _subgroup_tile(
    entries: tuple[Entry, ...],
    loops: tuple[int, ...],
    intrinsic: np.ndarray,
    value: Any,
    rows: int,
) -> np.ndarray:
    """Elements of one subgroup's tile over a class of loops (TileAndFuse `subgroup` entries)."""
    out = np.ones(rows, dtype=np.int64)
    for position, loop in enumerate(loops):
        size = np.maximum(value(entries[loop]), 1)
        if position == len(loops) - 1:
            size = size * intrinsic  # the innermost loop is distributed in intrinsic tiles
        out *= size
    return out


WAVES_PER_EU = "waves_per_eu"


#: Rows of one constraint op and intrinsic from which `compilation_infos` uses a template.
_TEMPLATE_MIN_ROWS = 16


#: Knobs with at most this many values among the rows are fixed per template group.
_FIXED_MAX_VALUES = 3


def _with_waves_per_eu(info: Any, waves: int) -> Any:
    """The same compilation_info with `llvm_func_attrs = {"amdgpu-waves-per-eu" = "N"}` added."""
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen

    info = iree_codegen.CompilationInfoAttr(info)
    old = info.translation_info
    entries = {}
    if old.configuration is not None:
        config = ir.DictAttr(old.configuration)
        entries = {config[i].name: config[i].attr for i in range(len(config))}
    entries["llvm_func_attrs"] = ir.DictAttr.get(
        {"amdgpu-waves-per-eu": ir.StringAttr.get(str(waves))}
    )
    translation = iree_codegen.TranslationInfoAttr.get(
        old.pass_pipeline, old.codegen_spec, list(old.workgroup_size), old.subgroup_size,
        ir.DictAttr.get(entries),
    )
    return iree_codegen.CompilationInfoAttr.get(info.lowering_config, translation)


def materialize(op: Any, assignments: Mapping[str, int], batch_loops: Sequence[int] = ()) -> Any:
    """IREE's `compilation_info` for one knob assignment of a constraints op.

    Attention also needs a `decomposition_config` (the intrinsics and subgroup bases of its two
    matmuls), an attribute of the op beside `compilation_info`. So that a candidate stays one
    attribute (one string in tables, logs and specs), it rides inside the lowering_config
    dictionary under `decomposition_config`; `ir.spec` moves it back to the op's attribute.
    `batch_loops`: the space's `GpuSpace.batch_loops` (a batch tile of 1 is inserted there).
    """
    from iree.compiler.dialects import iree_codegen

    info = iree_codegen.materialize_compilation_info(op, dict(assignments))
    if batch_loops:
        info = with_batch_tiles(info, batch_loops)
    if DECOMPOSITION_KEY not in op.attributes["knobs"]:
        return info
    decomposition = iree_codegen.materialize_configuration_attr(
        op, DECOMPOSITION_KEY, dict(assignments))
    if batch_loops:
        decomposition = _decomposition_with_batch_loops(decomposition, batch_loops)
    return with_decomposition(info, decomposition)


def _decomposition_with_batch_loops(decomposition: Any, loops: Sequence[int]) -> Any:
    """An attention `decomposition_config` for the op with `loops` inserted: each matmul's
    subgroup basis (Q x K^T leaves out N, P x V leaves out K1; every inserted loop is in both)
    gets one subgroup along them."""
    from iree.compiler import ir
    from iree.compiler.dialects import iree_gpu

    parts = ir.DictAttr(decomposition)
    out = {parts[i].name: parts[i].attr for i in range(len(parts))}
    for name in ("qk_attrs", "pv_attrs"):
        attrs = ir.DictAttr(out[name])
        fields = {attrs[i].name: attrs[i].attr for i in range(len(attrs))}
        config = iree_gpu.LoweringConfigAttr(fields["lowering_config"]).attributes
        entries = {config[i].name: config[i].attr for i in range(len(config))}
        if "subgroup_basis" in entries:
            entries["subgroup_basis"] = _basis_with_loops(entries["subgroup_basis"], loops)
        fields["lowering_config"] = iree_gpu.LoweringConfigAttr.get(ir.DictAttr.get(entries))
        out[name] = ir.DictAttr.get(fields)
    return ir.DictAttr.get(out)


class GpuMaterializer:
    """Materialises `compilation_info` for GPU rows with IREE (keeps one parsed module)."""

    def __init__(self, module_text: str, spaces: Sequence[GpuSpace]) -> None:
        self.module_text = module_text
        self.knobs = {s.index: s.knobs for s in spaces}
        self.batch_loops = {s.index: s.batch_loops for s in spaces}
        # Loop bounds (and convolution loops) of the TileAndFuse spaces whose rows may need
        # `padding` (`_with_padding`): contractions and implicit-GEMM convolutions. Direct
        # convolutions are left as IREE's template has them (padding them broke candidates).
        self.padded = {s.index: (s.loop_bounds, s.conv_loops) for s in spaces
                       if s.pipeline == "TileAndFuse"
                       and (s.kind == "contraction" or (s.kind == "convolution" and s.conv_loops))}
        self._state: tuple[Any, Any, list[Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"module_text": self.module_text, "knobs": self.knobs,
                "batch_loops": self.batch_loops, "padded": self.padded, "_state": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Pickles from before batch loops or padding.
        self.__dict__.update({"batch_loops": {}, "padded": {}, **state})

    def _ops(self) -> tuple[Any, list[Any]]:
        from iree.compiler import ir

        if self._state is None:
            context = ir.Context()
            with context:
                module = ir.Module.parse(self.module_text)
            self._state = (context, module, constraint_ops(module))
        return self._state[0], self._state[2]

    def compilation_info(self, row: pd.Series) -> str:
        return self.compilation_infos(row.to_frame().T)[0]

    def compilation_infos(self, rows: pd.DataFrame) -> list[str]:
        """`compilation_info` text of many rows (e.g. a whole ranked space), in their order.

        IREE's materialisation substitutes knob values into the constraint op's template, so the
        text of every row sharing a constraint op and an intrinsic is one format string: it is
        built once from distinctive sentinel values, checked against IREE's own text on three real
        rows of the group, and filled per row (about 100x faster than materialising each row).
        A group whose check fails, or with `waves_per_eu`, is materialised row by row.
        """
        context, ops = self._ops()
        spaces = rows["space"].to_numpy(dtype=np.int64)
        waves_column = f"knob_{WAVES_PER_EU}"
        waves = (rows[waves_column].to_numpy(dtype=np.int64) if waves_column in rows
                 else np.zeros(len(rows), dtype=np.int64))
        knobs = {name: rows[f"knob_{name}"].to_numpy(dtype=np.int64)
                 for names in self.knobs.values() for name in names if f"knob_{name}" in rows}
        # One-of knobs (`mma_idx`, `use_igemm_idx`, ...) pick whole attributes, and a scalar equal
        # to its default is not printed (`prefetch_num_stages = 0`): knobs of one-of kind or with
        # at most 3 values in these rows are fixed per group, the others are template fields.
        choices = sorted(k for k in knobs
                         if k.endswith("_idx") or len(np.unique(knobs[k])) <= _FIXED_MAX_VALUES)
        keys = np.stack([spaces, waves > 0, *(knobs[k] for k in choices)], axis=1)
        out = [""] * len(rows)
        with context:
            # One pass groups the rows (not a scan of every row per group).
            unique, group = np.unique(keys, axis=0, return_inverse=True)
            by_group = np.argsort(group.ravel(), kind="stable")
            bounds = np.searchsorted(group.ravel()[by_group], np.arange(len(unique) + 1))
            for index, key in enumerate(unique):
                members = by_group[bounds[index]:bounds[index + 1]]
                space, names = int(key[0]), self.knobs[int(key[0])]
                fixed = {k: int(v) for k, v in zip(choices, key[2:], strict=True) if k in names}
                values = [knobs[k][members] for k in names]
                # Small groups (single rows) are cheaper materialised than templated and checked.
                templated = not key[1] and len(members) >= _TEMPLATE_MIN_ROWS
                batch = self.batch_loops.get(space, ())
                template = self._template(ops[space], names, fixed, batch) if templated else None
                if template is not None:
                    texts = [template.format(*row) for row in zip(*(v.tolist() for v in values),
                                                                 strict=True)]
                    checked = (0, len(members) // 2, len(members) - 1)
                    if all(texts[e] == self._materialize(ops[space], names, values, e, 0, batch)
                           for e in checked):
                        for i, text in zip(members.tolist(), texts, strict=True):
                            out[i] = text
                        continue
                for j, i in enumerate(members.tolist()):
                    out[i] = self._materialize(ops[space], names, values, j, int(waves[i]),
                                               batch)
            if self.padded:
                mma_k = rows["mma_k"].to_numpy(dtype=np.int64)
                for i in np.flatnonzero(np.isin(spaces, list(self.padded))).tolist():
                    loop_bounds, conv_loops = self.padded[int(spaces[i])]
                    out[i] = _with_padding(out[i], loop_bounds, int(mma_k[i]), conv_loops)
        return out

    @staticmethod
    def _materialize(op: Any, names: Sequence[str], values: Sequence[np.ndarray], j: int,
                     waves: int, batch_loops: Sequence[int] = ()) -> str:
        info = materialize(op, {k: int(v[j]) for k, v in zip(names, values, strict=True)},
                           batch_loops)
        return str(_with_waves_per_eu(info, waves) if waves > 0 else info)

    @staticmethod
    def _template(op: Any, names: Sequence[str], fixed: Mapping[str, int],
                  batch_loops: Sequence[int] = ()) -> str | None:
        """A `str.format` template of one constraint op's text (knobs in `names` order; the
        one-of knobs in `fixed` given), or None."""
        sentinels = [fixed.get(k, 7_300_001 + 2 * n) for n, k in enumerate(names)]
        try:
            text = str(materialize(op, dict(zip(names, sentinels, strict=True)), batch_loops))
        except Exception:  # IREE refusing the sentinels: materialise row by row
            return None
        text = text.replace("{", "{{").replace("}", "}}")
        for n, (k, sentinel) in enumerate(zip(names, sentinels, strict=True)):
            if k in fixed:
                continue  # chosen by the group: already spelled out in the text
            text = re.sub(rf"(?<![0-9]){sentinel}(?![0-9])", f"{{{n}}}", text)
        return text


def _with_padding(info: str, bounds: Sequence[int], mma_k: int,
                  conv_loops: Sequence[int] = ()) -> str:
    """A TileAndFuse `compilation_info` with IREE's `padding` when a loop is not a multiple of
    its tile, else unchanged.

    IREE's own TileAndFuse configs of unaligned problems pad every loop to its tile (workgroup
    tile; reduction tile in elements, counted in intrinsic K units by the config), and for an
    implicit-GEMM convolution also state `padding_conv` over the convolution's own loops (the
    tile of the implicit-GEMM loop a parallel loop maps to, 0 for reduction loops:
    `conv_loops`). Its knob template leaves both out, and without them every such candidate
    fails to compile (77 x 131 x 999 f16 -> f32: "write affecting operations on shared resources are
    restricted to lane or thread"; a stride-2 3x3 convolution to 28 x 28: "'tensor.expand_shape'
    op expected dimension ..."). Aligned problems keep IREE's own text (no `padding`)."""
    from iree.compiler import ir

    found = re.search(r"\bworkgroup = \[([^\]]*)\]", info)
    reduced = re.search(r"\breduction = \[([^\]]*)\]", info)
    if found is None or reduced is None:
        return info
    workgroup = [int(v) for v in found.group(1).split(",")]
    reduction = [int(v) for v in reduced.group(1).split(",")]
    if len(workgroup) != len(bounds) or len(reduction) != len(bounds):
        return info
    padding = [w or r * mma_k for w, r in zip(workgroup, reduction, strict=True)]
    if all(p == 0 or b % p == 0 for p, b in zip(padding, bounds, strict=True)):
        return info
    entries = f"padding = {padding}, "
    if conv_loops:
        entries += f"padding_conv = {[padding[i] if i >= 0 else 0 for i in conv_loops]}, "
    text = info.replace("lowering_config<{", f"lowering_config<{{{entries}", 1)
    return str(ir.Attribute.parse(text))  # in IREE's own key order, as applied configs print


def enumerate_gpu(
    problem: Problem,
    target: Target,
    pipeline: str | None = None,
    limit: int | None = None,
    extra_knobs: Mapping[str, Sequence[int]] | None = None,
    heuristic_filters: bool = True,
) -> CandidateSet:
    """Candidates of every (or one) GPU pipeline, in IREE's constraint-op order.

    `heuristic_filters=False`: the whole valid space, without IREE's heuristic filters.
    """
    if pipeline is not None and pipeline not in GPU_PIPELINES:
        raise DispatchTuneError(
            f"unknown GPU pipeline {pipeline!r}; choose one of {', '.join(GPU_PIPELINES)}"
        )
    spaces = gpu_spaces(problem, target, heuristic_filters)
    chosen = [s for s in spaces if pipeline is None or s.pipeline == pipeline]
    if not chosen:
        raise DispatchTuneError(f"IREE emits no {pipeline} constraints for this problem")
    materializer = GpuMaterializer(constraints_module(constraint_source(problem, target)[0], target),
                                   spaces)
    tables: list[pd.DataFrame] = []
    remaining = limit
    for space in chosen:
        if remaining is not None and remaining <= 0 and tables:  # limit=0: one empty table
            break
        table = enumerate_space(space, remaining)
        if extra_knobs:
            table = _cross_extra(table, space, extra_knobs)
            if remaining is not None:
                table = table.iloc[:remaining]
        tables.append(table)
        if remaining is not None:
            remaining -= len(table)
    sets = [
        CandidateSet(problem, target, t, {s.pipeline: materializer for s in chosen}) for t in tables
    ]
    result = CandidateSet.concat(sets)
    if not len(result) and limit != 0:
        # Said here, once for rank, candidates and tune: an empty table would read as "0
        # candidates" and a tuning run would have nothing to try.
        raise UnsupportedProblem(
            f"IREE's {'/'.join(s.pipeline for s in chosen)} constraints admit no configuration of "
            f"{problem.describe()} on {target.name}: nothing to tune (IREE's default config stays)"
        )
    # The columns depend on the chosen pipelines only, not on where `limit` cut the rows.
    table = result.table
    for space in chosen:
        for knob in space.knobs:
            if f"knob_{knob}" not in table.columns:
                table[f"knob_{knob}"] = np.full(len(table), -1, dtype=np.int64)
    table["default_match"] = default_match(table, iree_default_columns(problem, target))
    result.table = table
    return result


#: The knobs `default_match` compares with IREE's own configuration (docs/gpu_order.md, part 24:
#: expert configurations keep IREE's value of each more often than the space does).
DEFAULT_KNOBS = ("tile_m", "tile_n", "tile_k", "workgroup_threads", "subgroups_m", "subgroups_n",
                 "intrinsic", "pipeline")


def iree_default_columns(problem: Problem, target: Target) -> dict[str, object] | None:
    """IREE's own configuration of `problem` on `target` in the candidate-table vocabulary, read
    from the configured module its constraints come with (no extra compile); None where the
    constraints are another op's (a batch matmul's batch-less equivalent, raised small loops) or
    the configuration cannot be read (no MMA intrinsic).

    An attention whose outer loops IREE collapses when it compiles the op alone (SDXL's batch x
    heads) takes its constraints from the op without them: IREE's configuration of that op, with
    a tile of 1 there, is what `iree-compile` applies to the op alone (the same columns on all 8
    attention shapes of the public spec files: docs/gpu_order.md, part 32)."""
    from dispatchtune.candidate import configured_compilation_infos
    from dispatchtune.datasets.expert_specs import configuration_columns

    try:
        source, left_out = constraint_source(problem, target)
        collapsed = (problem.kind == "attention" and bool(left_out)
                     and left_out == collapsed_loops(problem, target))
        if not collapsed and (source.key != problem.key or left_out):
            return None
        infos = configured_compilation_infos(constraints_module(source, target))
        return dict(configuration_columns(infos[0], problem)) if infos and infos[0] else None
    except (DispatchTuneError, ValueError, IndexError, KeyError) as exc:
        logger.debug("IREE's default configuration of %s is not read: %s", problem.key, exc)
        return None


def default_match(table: pd.DataFrame, default: Mapping[str, object] | None) -> np.ndarray:
    """Per row of a GPU candidate table, how many of `DEFAULT_KNOBS` equal IREE's own
    configuration `default` (0-8), or -1 throughout when it is unknown or has no intrinsic."""
    if not default or not default.get("intrinsic"):
        return np.full(len(table), -1, dtype=np.int64)
    match = np.zeros(len(table), dtype=np.int64)
    for knob in DEFAULT_KNOBS:
        if knob in table and knob in default:
            column = table[knob].to_numpy()
            value = default[knob]
            match += (column.astype(str) == str(value)) if column.dtype == object else (
                column == value)
    return match


def _cross_extra(
    table: pd.DataFrame, space: GpuSpace, extra: Mapping[str, Sequence[int]]
) -> pd.DataFrame:
    """Replace knobs IREE fixes (e.g. prefetch_num_stages) by explicit extra dimensions.

    `waves_per_eu` (AMD only) is not an IREE knob: it becomes the LLVM function attribute
    `amdgpu-waves-per-eu` in the translation_info configuration (0 = compiler default).
    """
    for knob, values in extra.items():
        if knob == WAVES_PER_EU:
            amd = any(i.startswith(("MFMA", "WMMA")) for i in space.intrinsics)
            if not amd:
                raise DispatchTuneError("waves_per_eu applies to AMD targets only")
        elif knob not in space.knobs:
            raise DispatchTuneError(f"{space.pipeline} has no knob {knob!r} to vary")
        if not values or any(int(v) < 0 for v in values):
            raise DispatchTuneError(f"extra knob {knob!r} needs non-negative values")
        parts = []
        for v in values:
            part = table.copy()
            part[f"knob_{knob}"] = int(v)
            if knob == "prefetch_num_stages":
                part["prefetch_stages"] = int(v)
            if knob == WAVES_PER_EU:
                part["waves_per_eu"] = int(v)
            parts.append(part)
        # Row-major: each configuration with every extra value in turn (stable, deterministic).
        order = np.arange(len(table) * len(parts)).reshape(len(parts), len(table)).T.ravel()
        table = pd.concat(parts, ignore_index=True).iloc[order].reset_index(drop=True)
    return table
