"""GPU candidate spaces from IREE's own SMT constraints (real iree-compile, real Z3)."""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import z3

from dispatchtune.errors import DispatchTuneError
from dispatchtune.ir.spec import applied_configs, config_applied, tuning_spec, write_spec
from dispatchtune.problem import Problem
from dispatchtune.search import CandidateSet, enumerate_candidates
from dispatchtune.search.gpu import GpuMaterializer, enumerate_space, reference_solutions
from dispatchtune.search.gpu_source import (
    CONSTRAINTS_OP,
    constraints_module,
    with_small_loops_raised,
    without_loops,
)
from dispatchtune.search.gpu_space import GpuSpace, gpu_spaces, violated_constraints
from dispatchtune.targets import get_target
from dispatchtune.toolchain import run_tool

SMALL = Problem.matmul(64, 64, 64, "f16")
SMALL_T = Problem.matmul(64, 64, 64, "f16", transpose_b=True)


@functools.cache
def _spaces(target: str, transpose: bool = False) -> tuple[GpuSpace, ...]:
    return tuple(gpu_spaces(SMALL_T if transpose else SMALL, get_target(target)))


def _space(target: str, pipeline: str, transpose: bool = False) -> GpuSpace:
    return next(s for s in _spaces(target, transpose) if s.pipeline == pipeline)


def _knob_rows(space: GpuSpace, table: pd.DataFrame) -> list[tuple[int, ...]]:
    return list(table[[f"knob_{k}" for k in space.knobs]].itertuples(index=False, name=None))


@pytest.mark.parametrize(
    ("target", "pipeline", "transpose"),
    [
        ("gfx942", "TileAndFuse", False),
        ("gfx942", "VectorDistribute", False),
        ("sm_80", "TileAndFuse", True),
        ("gfx1100", "TileAndFuse", False),
    ],
)
def test_same_set_as_blocking_clauses_and_every_row_satisfies(
    target: str, pipeline: str, transpose: bool
) -> None:
    space = _space(target, pipeline, transpose)
    table = enumerate_space(space)
    rows = _knob_rows(space, table)
    assert len(rows) == len(set(rows)) > 0
    assert set(rows) == reference_solutions(space)
    solver = z3.Solver()
    solver.add(*z3.parse_smt2_string(space.smtlib))
    for row in rows:
        fixed = [z3.Int(k) == v for k, v in zip(space.knobs, row, strict=True)]
        assert solver.check(*fixed) == z3.sat


def test_columns_are_in_elements_and_consistent() -> None:
    cands = enumerate_candidates(Problem.matmul(256, 128, 512, "f16"), "gfx942")
    t = cands.table
    assert isinstance(t.index, pd.RangeIndex)
    assert set(t["pipeline"]) == {"TileAndFuse", "VectorDistribute"}
    assert (t["tile_b"] == 1).all()
    assert (t["intrinsic"].str.startswith("MFMA_")).all()
    assert (t["tile_m"] % t["vec_m"] == 0).all() and (t["tile_n"] % t["vec_n"] == 0).all()
    threads = t["subgroups_m"] * t["subgroups_n"] * t["subgroup_size"]
    assert (t["workgroup_threads"] == threads).all()
    assert (256 % t["tile_m"] == 0).all() and (128 % t["tile_n"] == 0).all()
    assert (t["workgroups"] == (256 // t["tile_m"]) * (128 // t["tile_n"])).all()
    tf = t[t["pipeline"] == "TileAndFuse"]
    vd = t[t["pipeline"] == "VectorDistribute"]
    # TileAndFuse counts K in intrinsic units and the subgroup tile in MMA tiles: converted.
    assert (tf["tile_k"] == tf["knob_red_2"] * tf["mma_k"]).all()
    assert (tf["vec_m"] == tf["knob_sg_0"] * tf["mma_m"]).all()
    assert (vd["tile_k"] == vd["knob_red_2"]).all()
    assert (vd["subgroups_m"] == vd["knob_sg_m_cnt"]).all()
    assert (tf["knob_sg_m_cnt"] == -1).all()  # VD-only knob, absent from TileAndFuse rows
    assert (t["prefetch_stages"] == 2).all()
    assert (t["tile_k"] <= 512).all() and (512 % t["tile_k"] == 0).all()


def test_compilation_info_is_materialised_from_the_row() -> None:
    cands = enumerate_candidates(SMALL, "gfx942")
    for i in (0, len(cands) // 2, len(cands) - 1):
        row = cands.table.iloc[i]
        text = cands.compilation_info(i)
        assert text.startswith("#iree_codegen.compilation_info<")
        assert f"workgroup = [{row['knob_wg_0']}, {row['knob_wg_1']}, 0]" in text
        assert f"reduction = [0, 0, {row['knob_red_2']}]" in text
        assert f"pipeline = #iree_gpu.pipeline<{row['pipeline']}>" in text
        assert row["intrinsic"] in text
        assert f"workgroup_size = [{row['workgroup_threads']}, 1, 1]" in text
    assert cands.compilation_infos([0, 1]) == [cands.compilation_info(0), cands.compilation_info(1)]


def test_order_is_deterministic_and_limit_is_a_prefix() -> None:
    first = enumerate_candidates(SMALL, "sm_80")
    again = enumerate_candidates(SMALL, "sm_80")
    pd.testing.assert_frame_equal(first.table, again.table)
    head = enumerate_candidates(SMALL, "sm_80", limit=25)
    assert len(head) == 25
    pd.testing.assert_frame_equal(head.table, first.table.iloc[:25].reset_index(drop=True))
    vd = enumerate_candidates(SMALL, "sm_80", pipeline="VectorDistribute")
    assert set(vd.table["pipeline"]) == {"VectorDistribute"}
    assert len(vd) == int((first.table["pipeline"] == "VectorDistribute").sum())


def test_extra_knob_prefetch_stages_is_an_explicit_dimension() -> None:
    base = enumerate_candidates(SMALL, "gfx942", pipeline="TileAndFuse")
    wide = enumerate_candidates(
        SMALL, "gfx942", pipeline="TileAndFuse", extra_knobs={"prefetch_num_stages": (1, 3)}
    )
    assert len(wide) == 2 * len(base)
    assert list(wide.table["prefetch_stages"][:4]) == [1, 3, 1, 3]
    assert "prefetch_num_stages = 3" in wide.compilation_info(1)
    with pytest.raises(DispatchTuneError, match="no knob"):
        enumerate_candidates(SMALL, "gfx942", extra_knobs={"wave_count": (1, 2)})


def test_extra_knob_waves_per_eu_on_amd_only() -> None:
    waves = enumerate_candidates(SMALL, "gfx942", limit=2, extra_knobs={"waves_per_eu": (0, 2)})
    assert list(waves.table["waves_per_eu"]) == [0, 2]
    assert "amdgpu-waves-per-eu" not in waves.compilation_info(0)
    assert 'llvm_func_attrs = {"amdgpu-waves-per-eu" = "2"}' in waves.compilation_info(1)
    assert (enumerate_candidates(SMALL, "gfx942", limit=3).table["waves_per_eu"] == 0).all()
    with pytest.raises(DispatchTuneError, match="AMD targets only"):
        enumerate_candidates(SMALL, "sm_80", extra_knobs={"waves_per_eu": (2,)})


def test_convolution_spaces_map_to_the_gemm_view() -> None:
    problem = Problem.conv2d_nhwc_hwcf(2, 8, 8, 32, 32, 3, 3, "f16")
    cands = enumerate_candidates(problem, "gfx942")
    t = cands.table
    assert set(t["igemm"]) == {0, 1}
    direct = t[t["igemm"] == 0]
    assert (direct["tile_oh"] > 0).all() and (direct["tile_ow"] > 0).all()
    # M = batch x output image: the workgroup's M tile is the product of those loop tiles.
    assert (direct["tile_m"] % (direct["tile_oh"] * direct["tile_ow"]) == 0).all()
    assert (t["tile_n"] <= 32).all() and (32 % t["tile_n"] == 0).all()
    assert (t["tile_k"] > 0).all() and ((3 * 3 * 32) % t["tile_k"] == 0).all()
    text = cands.compilation_info(int(np.flatnonzero(t["igemm"].to_numpy() == 1)[0]))
    assert "use_igemm_convolution = true" in text


def test_candidate_set_concat_fills_missing_knobs() -> None:
    tf = enumerate_candidates(SMALL, "gfx942", pipeline="TileAndFuse", limit=3)
    vd = enumerate_candidates(SMALL, "gfx942", pipeline="VectorDistribute", limit=2)
    both = CandidateSet.concat([tf, vd])
    assert len(both) == 5
    assert list(both.table["pipeline"]) == ["TileAndFuse"] * 3 + ["VectorDistribute"] * 2
    assert re.search(r"subgroup_basis", both.compilation_info(4))
    assert (both.table.loc[:2, "knob_sg_n_cnt"] == -1).all()


def test_unsupported_inputs_are_one_line_errors() -> None:
    with pytest.raises(DispatchTuneError, match="unknown GPU pipeline"):
        enumerate_candidates(SMALL, "gfx942", pipeline="DoubleTilingExpert")
    with pytest.raises(DispatchTuneError, match=r"no GPU constraints|no MMA"):
        enumerate_candidates(Problem.matmul(64, 64, 64, "f32"), "sm_80")


def _added_rows(problem: Problem) -> tuple[CandidateSet, CandidateSet, np.ndarray]:
    """The filtered and the whole space, and the rows only the whole space has."""
    filtered = enumerate_candidates(problem, "gfx942", heuristic_filters=True)
    whole = enumerate_candidates(problem, "gfx942", heuristic_filters=False)
    keys = [c for c in whole.table.columns if c.startswith("knob_")] + ["pipeline"]
    merged = whole.table.merge(filtered.table[keys].assign(kept=True), on=keys, how="left")
    return filtered, whole, merged["kept"].isna().to_numpy()


def test_whole_space_drops_only_the_heuristic_filters() -> None:
    filtered, whole, added = _added_rows(Problem.matmul(512, 512, 512, "f16"))
    assert len(whole) - len(filtered) == int(added.sum()) > 0  # a strict superset
    # The whole space is the default (docs/gpu_order.md, part 35: measured faster on an MI300X).
    assert len(enumerate_candidates(Problem.matmul(512, 512, 512, "f16"), "gfx942")) == len(whole)
    t = whole.table
    heuristic_ok = (
        (t["workgroup_threads"] <= np.maximum(t["tile_m"], t["tile_n"]))
        & (t["tile_k"] % t["mma_m"] == 0)
    ).to_numpy()
    vd = (t["pipeline"] == "VectorDistribute").to_numpy()
    # Every added row is a VectorDistribute row that breaks one of IREE's two heuristic filters;
    # every kept VectorDistribute row satisfies both; TileAndFuse is unchanged.
    assert (vd[added] & ~heuristic_ok[added]).all()
    assert heuristic_ok[vd & ~added].all()
    assert (~added[~vd]).all()


def test_added_candidates_apply_and_compile(tmp_path: Path) -> None:
    """A sample of the candidates the option adds: IREE applies each exactly and compiles it."""
    problem = Problem.matmul(256, 256, 512, "f16")
    _, whole, added = _added_rows(problem)
    source = tmp_path / "mm.mlir"
    source.write_text(problem.to_mlir())
    target = get_target("gfx942")
    rows = np.flatnonzero(added)
    for i in rows[np.linspace(0, len(rows) - 1, 2).astype(int)].tolist():
        info = whole.compilation_info(i)
        spec = write_spec(tuning_spec([(problem, info)]), tmp_path / f"spec{i}.mlir")
        assert any(config_applied(info, got) for got in applied_configs(source, target, spec))
        flags = target.tuning_spec_flags(spec)
        proc = run_tool("iree-compile", [str(source), *target.compile_flags, *flags, "-o",
                                         str(tmp_path / "op.vmfb")])
        assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("problem", "extra"),
    [
        (Problem.conv2d_nhwc_hwcf(2, 16, 16, 64, 64, 3, 3, "f16"), None),  # one-of igemm knob
        (SMALL, {"waves_per_eu": (0, 2), "prefetch_num_stages": (0, 2)}),  # elided defaults
    ],
)
def test_batch_compilation_infos_equal_irees_own_per_row(
    problem: Problem, extra: dict[str, tuple[int, ...]] | None
) -> None:
    """`compilation_infos` (templated per constraint op) is exactly IREE's text for every row."""
    cands = enumerate_candidates(problem, "gfx942", extra_knobs=extra)
    table = cands.table
    for pipeline in set(table["pipeline"].astype(str)):
        rows = table[table["pipeline"].astype(str) == pipeline]
        materializer = cands.materializers[pipeline]
        assert isinstance(materializer, GpuMaterializer)
        texts = materializer.compilation_infos(rows)
        # A single row is never templated: IREE materialises it directly.
        assert texts == [cands.compilation_info(int(i)) for i in rows.index]


ATTENTION = Problem.attention(2, 256, 64, 64, 256, "f16")


def test_attention_enumerates_from_irees_constraints() -> None:
    """Attention: one VectorDistribute space (IREE's), columns in the Q x K^T GEMM view, without
    the K2 tiles smaller than the Q x K^T intrinsic's N that IREE admits but cannot compile."""
    (space,) = gpu_spaces(ATTENTION, get_target("gfx942"))
    assert space.kind == "attention" and space.mma_knob == "qk_mma_idx"
    cands = enumerate_candidates(ATTENTION, "gfx942")
    t = cands.table
    assert len(t) == len(set(_knob_rows(space, t))) > 10
    assert set(_knob_rows(space, t)) == reference_solutions(space)
    assert (t["tile_n"] >= t["mma_n"]).all()
    unfloored = dataclasses.replace(space, smtlib=space.smtlib.split("(assert (=> (= qk_mma_idx")[0])
    assert len(reference_solutions(unfloored)) > len(t)
    assert (t["tile_m"] == t["knob_m_tile"]).all() and (t["tile_n"] == t["knob_red_k2"]).all()
    assert (t["tile_k"] == 64).all()  # K1 (the head dim) is never tiled
    assert (t["workgroups"] == 2 * (256 // t["knob_m_tile"]) * (64 // t["knob_n_tile"])).all()
    assert (t["subgroups_m"] * t["subgroups_n"] * t["subgroup_size"] == t["workgroup_threads"]).all()
    assert (t["vec_m"] * t["subgroups_m"] == t["tile_m"]).all()
    qk = np.array(space.mma_shapes)[t["knob_qk_mma_idx"].to_numpy()]
    assert (t["mma_m"].to_numpy() == qk[:, 0]).all()
    # The decomposition config (both matmuls' intrinsics and subgroup bases) rides in the config.
    info = cands.compilation_info(len(t) - 1)
    assert "decomposition_config = {pv_attrs" in info and "qk_attrs" in info


def test_attention_candidates_apply_and_compile(tmp_path: Path) -> None:
    """A spec built from attention candidates is applied exactly (decomposition included)."""
    cands = enumerate_candidates(ATTENTION, "gfx942")
    source = tmp_path / "attention.mlir"
    source.write_text(ATTENTION.to_mlir())
    target = get_target("gfx942")
    # Differing intrinsics between the two matmuls, and the last row.
    mixed = cands.table.index[cands.table["knob_qk_mma_idx"] != cands.table["knob_pv_mma_idx"]]
    for n, i in enumerate((int(mixed[0]), len(cands) - 1)):
        info = cands.compilation_info(i)
        spec = write_spec(tuning_spec([(ATTENTION, info)]), tmp_path / f"spec{i}.mlir")
        assert "apply_attn_op_config" in spec.read_text()
        assert any(config_applied(info, got) for got in applied_configs(source, target, spec))
        if n == 0:
            flags = target.tuning_spec_flags(spec)
            proc = run_tool("iree-compile", [str(source), *target.compile_flags, *flags, "-o",
                                             str(tmp_path / "attention.vmfb")])
            assert proc.returncode == 0, proc.stderr[-2000:]


def test_oriented_attention_intrinsics_store_the_output_in_vectors(tmp_path: Path) -> None:
    """On SDXL's attention layout, a 128 x 64 tile compiled with the intrinsics oriented as IREE
    orients its own configs (`col_major`) stores the output in vectors; the same candidate as
    IREE's knob template lists it stores it 16 bits at a time (gfx942 ISA)."""
    from dispatchtune import load_problems
    from dispatchtune.datasets.expert_specs import attention_problem

    target = get_target("gfx942")
    source = tmp_path / "attention.mlir"
    source.write_text(attention_problem((2, 2, 512, 64, 64, 64), "f16").to_mlir())
    (problem,) = load_problems(source, target)
    cands = enumerate_candidates(problem, target, heuristic_filters=False)
    t = cands.table
    # The value head dim is 64: a workgroup tile of tile_v computes Q x K^T 64 / tile_v times.
    assert (t["qk_recompute"] == -(-64 // t["tile_v"])).all() and t["qk_recompute"].max() > 1
    row = int(t.index[(t["tile_m"] == 128) & (t["tile_n"] == 64) & (t["p_relayout"] == 0)
                      & (t["intrinsic"] == "VMFMA_F32_32x32x16_F16")][0])
    oriented = cands.compilation_info(row)
    stores = {}
    for name, info in (("oriented", oriented), ("template", oriented.replace(", col_major = true", ""))):
        spec = write_spec(tuning_spec([(problem, info)]), tmp_path / f"{name}.mlir")
        assert any(config_applied(info, got) for got in applied_configs(source, target, spec))
        dump = tmp_path / f"isa_{name}"
        proc = run_tool("iree-compile", [str(source), *target.compile_flags,
                                         *target.tuning_spec_flags(spec), "-o",
                                         str(tmp_path / f"{name}.vmfb"),
                                         f"--iree-hal-dump-executable-files-to={dump}"])
        assert proc.returncode == 0, proc.stderr[-2000:]
        (isa,) = dump.glob("*.rocmasm")
        stores[name] = isa.read_text().count("buffer_store_short")
    assert stores["oriented"] == 0 < stores["template"], stores


def test_attention_intrinsics_oriented_as_iree_and_their_layout_columns(tmp_path: Path) -> None:
    """Candidates orient both attention intrinsics as IREE's own default configuration does
    (`col_major`, which IREE's knob template leaves out); `p_relayout` says whether P changes
    layout between the two matmuls (IREE's default pair keeps it), `operand_bits` how wide the
    intrinsic's operand reads are."""
    cands = enumerate_candidates(ATTENTION, "gfx942")
    t = cands.table
    source = tmp_path / "attention.mlir"
    source.write_text(ATTENTION.to_mlir())
    (default,) = applied_configs(source, get_target("gfx942"), None)
    oriented = re.findall(r"mma_layout<(\w+), col_major = true>", default)
    assert len(oriented) == 2  # IREE's default: both matmuls col_major
    for i in (0, len(t) // 2, len(t) - 1):
        assert len(re.findall(r"mma_layout<\w+, col_major = true>", cands.compilation_info(i))) == 2
    pairs = t.groupby(["intrinsic", "pv_intrinsic"])["p_relayout"].agg(["min", "max"])
    assert (pairs["min"] == pairs["max"]).all()  # a property of the pair alone
    relayout = pairs["min"].to_dict()
    pv, qk = oriented  # printed in key order: pv_attrs first
    assert relayout[(qk, pv)] == 0
    assert relayout[("VMFMA_F32_32x32x16_F16", "MFMA_F32_32x32x8_F16")] == 0
    assert relayout[("VMFMA_F32_32x32x16_F16", "VMFMA_F32_32x32x16_F16")] == 1
    assert relayout[("MFMA_F32_16x16x16_F16", "VMFMA_F32_16x16x32_F16")] == 1
    bits = t.groupby("intrinsic")["operand_bits"].first().to_dict()
    assert bits["MFMA_F32_32x32x8_F16"] == 64 and bits["VMFMA_F32_32x32x16_F16"] == 128
    matmul = enumerate_candidates(Problem.matmul(256, 256, 256, "f16"), "gfx942").table
    assert set(matmul["operand_bits"]) == {64} and "p_relayout" not in matmul


BATCH = Problem.batch_matmul(2, 128, 128, 128, "f16")


def test_batch_matmul_from_the_batchless_constraints(tmp_path: Path) -> None:
    """IREE crashes emitting batch-matmul constraints: the batch-less ones with a batch tile of 1."""
    unbatched = without_loops(BATCH, BATCH.loops("batch"))
    assert unbatched is not None and unbatched.key == Problem.matmul(128, 128, 128, "f16").key
    spaces = gpu_spaces(BATCH, get_target("gfx942"))
    assert {s.pipeline for s in spaces} == {"TileAndFuse", "VectorDistribute"}
    assert all(s.batch_loops == (0,) and s.workgroup[0] == 1 and s.classes["b"] == (0,)
               for s in spaces)
    cands = enumerate_candidates(BATCH, "gfx942")
    plain = enumerate_candidates(Problem.matmul(128, 128, 128, "f16"), "gfx942")
    t = cands.table
    assert len(t) == len(plain) and (t["tile_b"] == 1).all()
    assert (t["workgroups"] == 2 * plain.table["workgroups"]).all()
    source = tmp_path / "bmm.mlir"
    source.write_text(BATCH.to_mlir())
    target = get_target("gfx942")
    for pipeline in ("TileAndFuse", "VectorDistribute"):
        rows = t.index[t["pipeline"] == pipeline]
        # Templated texts (every row) equal IREE's per-row materialisation with the batch tile.
        materializer = cands.materializers[pipeline]
        assert isinstance(materializer, GpuMaterializer)
        texts = materializer.compilation_infos(t.loc[rows])
        assert texts[:3] == [cands.compilation_info(int(i)) for i in rows[:3]]
        info = cands.compilation_info(int(rows[len(rows) // 2]))
        assert re.search(r"workgroup = \[1, \d+, \d+, 0\]", info)
        assert re.search(r"reduction = \[0, 0, 0, \d+\]", info)
        spec = write_spec(tuning_spec([(BATCH, info)]), tmp_path / f"{pipeline}.mlir")
        assert any(config_applied(info, got) for got in applied_configs(source, target, spec))
        if pipeline == "VectorDistribute":
            assert re.search(r"subgroup_basis = \[\[1, \d+, \d+, 1\], \[0, 1, 2, 3\]\]", info)
            flags = target.tuning_spec_flags(spec)
            proc = run_tool("iree-compile", [str(source), *target.compile_flags, *flags, "-o",
                                             str(tmp_path / "bmm.vmfb")])
            assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("target", ["sm_86", "gfx1201", "gfx90a"])
def test_batch_matmul_enumerates_on_other_gpus(target: str) -> None:
    cands = enumerate_candidates(BATCH, target)
    assert len(cands) > 0 and (cands.table["tile_b"] == 1).all()
    assert "workgroup = [1, " in cands.compilation_info(0)


def test_without_loops_refuses_a_compound_index() -> None:
    conv = Problem.conv2d_nhwc_hwcf(2, 8, 8, 16, 16, 3, 3, "f16")
    assert without_loops(conv, conv.loops("output_image")[:1]) is None


def test_violated_constraints_name_irees_assertions() -> None:
    """A candidate's own knob values violate nothing; a tile that does not divide the problem
    and too many threads for the tile are named by IREE's messages."""
    target = get_target("gfx942")
    space = _space("gfx942", "VectorDistribute")
    row = enumerate_space(space).iloc[0]
    values = {k: int(row[f"knob_{k}"]) for k in space.knobs}
    assert violated_constraints(SMALL, target, space, values) == []
    assert violated_constraints(SMALL, target, space, {**values, "wg_0": 48}) == [
        "dim_0 must be divisible by wg_0"]
    # A whole-space row that has more threads than its larger tile breaks only IREE's
    # heuristic filter (which the whole space drops).
    problem = Problem.matmul(512, 512, 512, "f16")
    filtered = next(s for s in gpu_spaces(problem, target) if s.pipeline == "VectorDistribute")
    whole = next(s for s in gpu_spaces(problem, target, heuristic_filters=False)
                 if s.pipeline == "VectorDistribute")
    t = enumerate_space(whole)
    crowded = t[t["workgroup_threads"] > np.maximum(t["tile_m"], t["tile_n"])].iloc[0]
    values = {k: int(crowded[f"knob_{k}"]) for k in whole.knobs}
    assert violated_constraints(problem, target, filtered, values) == [
        "wg_size_x <= wg_m OR wg_size_x <= wg_n"]
    assert violated_constraints(problem, target, whole, values, heuristic_filters=False) == []


def _grouped_conv() -> Problem:
    """2 x 16x16 output, 4 groups of 32 -> 32 channels, 3x3 filter (NHWGC, GFHWC), f16."""
    from dispatchtune.datasets.expert_specs import convolution_problem

    loops = "(d0, d1, d2, d3, d4, d5, d6, d7)"
    maps = [f"affine_map<{loops} -> (d0, d1 + d5, d2 + d6, d3, d7)>",
            f"affine_map<{loops} -> (d3, d4, d5, d6, d7)>",
            f"affine_map<{loops} -> (d0, d1, d2, d3, d4)>"]
    sizes = {"batch": (2,), "output_image": (16, 16), "depth": (4,), "output_channel": (32,),
             "filter_loop": (3, 3), "input_channel": (32,)}
    return convolution_problem(maps, sizes, ["f16", "f16", "f32"], "grouped")


def test_grouped_convolution_from_the_groupless_constraints(tmp_path: Path) -> None:
    """IREE crashes emitting grouped-conv constraints: the group-less ones with a group tile of
    1, in both lowerings (the group among the implicit GEMM's loops where it sits among the
    convolution's parallel loops); a candidate of each is applied exactly and compiles."""
    problem = _grouped_conv()
    assert problem.loops("depth") == (3,)
    target = get_target("gfx942")
    spaces = gpu_spaces(problem, target)
    direct = [s for s in spaces if not s.igemm]
    implicit = [s for s in spaces if s.igemm]
    assert direct and all(s.batch_loops == (3,) and s.workgroup[3] == 1 for s in direct)
    # Implicit GEMM (n, oh, ow, g, oc, K): the group is its loop 3 too, and `padding_conv`
    # follows the convolution's 8 loops.
    assert implicit and all(s.batch_loops == (3,) and s.workgroup[3] == 1
                            and s.loop_bounds[:5] == (2, 16, 16, 4, 32)
                            and s.conv_loops == (0, 1, 2, 3, 4, -1, -1, -1) for s in implicit)
    cands = enumerate_candidates(problem, target)
    t = cands.table
    assert len(t) > 0 and (t["tile_b"] == 1).all() and set(t["igemm"]) == {0, 1}
    source = tmp_path / "grouped.mlir"
    source.write_text(problem.to_mlir())
    for lowering, pattern in ((0, r"workgroup = \[\d+, \d+, \d+, 1, \d+, 0, 0, 0\]"),
                              (1, r"workgroup = \[\d+, \d+, \d+, 1, \d+, 0\]")):
        rows = t.index[t["igemm"] == lowering]
        info = cands.compilation_info(int(rows[len(rows) // 2]))
        assert re.search(pattern, info), info
        spec = write_spec(tuning_spec([(problem, info)]), tmp_path / f"spec{lowering}.mlir")
        assert any(config_applied(info, got) for got in applied_configs(source, target, spec))
        proc = run_tool("iree-compile", [str(source), *target.compile_flags,
                                         *target.tuning_spec_flags(spec), "-o",
                                         str(tmp_path / "grouped.vmfb")])
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_masked_attention_candidates_apply_on_gfx942(tmp_path: Path) -> None:
    """A masked attention (SDPA's boolean mask; IREE has made it i8 when specs are applied) is
    matched as a DAG: IREE's online_attention matcher op never matches a masked op."""
    from dispatchtune import load_problems

    source = tmp_path / "masked.mlir"
    source.write_text(Problem.attention(2, 128, 64, 64, 128, "f16", mask_type="i1").to_mlir())
    target = get_target("gfx942")
    (problem,) = load_problems(source, target)
    assert problem.mask_type == "i8" and problem.mask_map
    cands = enumerate_candidates(problem, target)
    for row in (0, len(cands) - 1):
        info = cands.compilation_info(row)
        spec = write_spec(tuning_spec([(problem, info)]), tmp_path / f"spec_{row}.mlir")
        assert any(config_applied(info, got) for got in applied_configs(source, target, spec))


def test_attention_whose_scale_is_not_its_query_type_is_matched(tmp_path: Path) -> None:
    """A torch f16 SDPA reaches gfx942's dispatch as an online_attention with an f32 scale (and
    f32 output): the matchers used to require an f16 scale, and every spec silently missed."""
    from dispatchtune import load_problems

    source = Path(__file__).parent / "fixtures" / "torch_sdpa_f16.mlir"
    target = get_target("gfx942")
    attention = [p for p in load_problems(source, target) if p.kind == "attention"]
    (problem,) = attention
    assert problem.input_types[0] == "f16" and problem.attention_scale_type == "f32"
    cands = enumerate_candidates(problem, target)
    for row in (0, len(cands) - 1):
        info = cands.compilation_info(row)
        spec = write_spec(tuning_spec([(problem, info)]), tmp_path / f"spec_{row}.mlir")
        assert any(config_applied(info, got) for got in applied_configs(source, target, spec))


def test_unit_loops_folded_by_iree_get_a_tile_of_1(tmp_path: Path) -> None:
    """BERT's f32 dispatch keeps the unit loops of a 1x128 x 768 x 1x768 contraction that IREE
    folds when the op is compiled alone: candidates state all 5 loops, and one compiles in the
    dispatch (with 3-entry lists every top candidate failed there)."""
    from dispatchtune import load_problems

    bench = Path(__file__).parent / "fixtures" / "gfx942_bert_unit_loops_benchmark.mlir"
    target = get_target("gfx942")
    (problem,) = load_problems(bench, target)
    assert problem.loop_sizes == (1, 128, 768, 1, 768)
    cands = enumerate_candidates(problem, target)
    info = cands.compilation_info(0)
    assert re.search(r"workgroup = \[1, \d+, \d+, 1, 0\]", info)
    spec = write_spec(tuning_spec([(problem, info)]), tmp_path / "spec.mlir")
    proc = run_tool("iree-compile", [str(bench), *target.tuning_spec_flags(spec), "-o",
                                     str(tmp_path / "bench.vmfb")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(config_applied(info, got) for got in applied_configs(bench, target, spec))


def test_attention_loops_iree_collapses_alone_get_a_tile_of_1(tmp_path: Path) -> None:
    """Llama's grouped-query attention keeps its query groups x sequence (2 x 128) as two M loops
    in the model's dispatch, which IREE collapses when the op is compiled alone: candidates state
    all 6 loops (tile 1 on the groups, one subgroup along them in both matmuls' bases), apply
    and compile in the dispatch. With 5-entry lists every candidate overflowed shared memory."""
    from dispatchtune import load_problems

    bench = Path(__file__).parent / "fixtures" / "gfx942_llama_gqa_attention_benchmark.mlir"
    target = get_target("gfx942")
    (problem,) = load_problems(bench, target)
    assert problem.loop_sizes == (4, 2, 128, 64, 64, 128) and problem.mask_map
    cands = enumerate_candidates(problem, target)
    info = cands.compilation_info(0)
    assert re.search(r"workgroup = \[1, 1, \d+, \d+, 0, 0\]", info)
    assert re.search(r"reduction = \[0, 0, 0, 0, 0, \d+\]", info)
    qk = re.search(r"qk_attrs = .*?subgroup_basis = \[\[([\d, ]+)\], \[([\d, ]+)\]\]", info)
    assert qk is not None and qk.group(1).startswith("1, 1, ") and qk.group(2) == "0, 1, 2, 4, 5"
    assert (cands.table["workgroups"] == 4 * 2 * (128 // cands.table["tile_m"])
            * (64 // cands.table["tile_v"])).all()
    spec = write_spec(tuning_spec([(problem, info)]), tmp_path / "spec.mlir")
    proc = run_tool("iree-compile", [str(bench), *target.tuning_spec_flags(spec), "-o",
                                     str(tmp_path / "bench.vmfb")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(config_applied(info, got) for got in applied_configs(bench, target, spec))


def test_contraction_loops_kept_in_the_dispatch_are_never_tiled_as_collapsed(
        tmp_path: Path) -> None:
    """ResNet's NCHW 1x1 convolution as a contraction, m=2x4x4: IREE collapses the 4x4 image
    when it compiles the op alone (4-entry template), its dispatch keeps 5 loops. Candidates
    of the collapsed op overflowed shared memory or timed out there; now the image's outer loop
    gets a tile of 1. IREE has no constraints for what is left (M 2x4, below the intrinsic):
    they come from the op with those loops raised, pinned back, and apply and compile."""
    from dispatchtune import load_problems
    from dispatchtune.search.gpu_source import _collapsible_outer, constraint_source

    bench = Path(__file__).parent / "fixtures" / "gfx942_resnet_nchw_1x1_benchmark.mlir"
    target = get_target("gfx942")
    (problem,) = load_problems(bench, target)
    assert problem.sizes("m") == (2, 4, 4)
    image = problem.loops("m")[1:]
    assert _collapsible_outer(problem, "m") == [image[0]]  # the batch loop is not adjacent
    source, left_out = constraint_source(problem, target)
    assert left_out == (image[0],) and source.sizes("m") == (16, 16)
    cands = enumerate_candidates(problem, target)
    infos = cands.compilation_infos()
    assert all(re.search(r"workgroup = \[\d+, \d+, 1, \d+, 0\]", info) for info in infos)
    for row in (0, len(cands) - 1):
        spec = write_spec(tuning_spec([(problem, infos[row])]), tmp_path / f"{row}.mlir")
        assert any(config_applied(infos[row], got)
                   for got in applied_configs(bench, target, spec))
        proc = run_tool("iree-compile", [str(bench), *target.tuning_spec_flags(spec), "-o",
                                         str(tmp_path / f"{row}.vmfb")])
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_sdxl_attention_candidates_name_every_loop_as_irees_own_spec() -> None:
    """SDXL's batch x heads attention: 6-entry tiles and bases in the form of IREE's built-in
    gfx942 spec (`[[1, 1, 4, 1, 1, 1], [0, 1, 2, 4, 5]]` for Q x K^T)."""
    from dispatchtune.datasets.expert_specs import attention_problem

    sdxl = attention_problem((2, 10, 4096, 64, 64, 64), "f16")
    unbatched = without_loops(sdxl, (0,))
    assert unbatched is not None and unbatched.loop_sizes == (10, 4096, 64, 64, 64)
    cands = enumerate_candidates(sdxl, "gfx942")
    t = cands.table
    assert (t["workgroups"] == 20 * (4096 // t["tile_m"]) * (64 // t["tile_v"])).all()
    info = cands.compilation_info(0)
    assert re.search(r"workgroup = \[1, 1, \d+, \d+, 0, 0\]", info)
    assert re.search(r"pv_attrs = .*?subgroup_basis = \[\[1, 1, \d, 1, 1, 1\], \[0, 1, 2, 3, 5\]\]",
                     info)


def test_unaligned_tileandfuse_candidates_are_padded_and_compile(tmp_path: Path) -> None:
    """IREE pads its own TileAndFuse configs of unaligned problems to the tile; its knob template
    does not, and unpadded candidates fail to compile. Candidates carry the same `padding`."""
    from dispatchtune import load_problems

    target = get_target("gfx942")
    source = tmp_path / "unaligned.mlir"
    source.write_text(Problem.matmul(77, 131, 999, "f16", out_type="f32").to_mlir())
    (problem,) = load_problems(source, target)
    cands = enumerate_candidates(problem, target)
    infos = cands.compilation_infos()
    assert all("padding = [" in info for info in infos)
    (default,) = applied_configs(source, target, None)
    assert "padding = [" in default  # IREE's own config of the same op
    for row in (0, len(cands) - 1):
        assert infos[row] == cands.compilation_info(row)
        _applies_and_compiles(problem, infos[row], source, tmp_path / f"m{row}")
    aligned = enumerate_candidates(Problem.matmul(256, 256, 256, "f16"), "gfx942")
    assert not any("padding" in info for info in aligned.compilation_infos([0, len(aligned) - 1]))


def test_a_contraction_below_the_intrinsic_gets_irees_padded_space(tmp_path: Path) -> None:
    """IREE 3.13 configures an M of 2 without MMA and emits no constraints; its TileAndFuse set
    rounds every loop up to the intrinsic, so the set of M = 16, pinned back to 2, is the op's:
    the same rows, padded, applied and compiled."""
    from dispatchtune import load_problems

    target = get_target("gfx942")
    small = Problem.matmul(2, 256, 512, "f16", out_type="f32")
    assert CONSTRAINTS_OP not in constraints_module(small, target)
    raised = with_small_loops_raised(small, target)
    assert raised is not None and raised.loop_sizes == (16, 256, 512)
    assert with_small_loops_raised(Problem.matmul(64, 64, 64, "f16"), target) is None
    # VectorDistribute's set divides the loops unpadded: it admits nothing at M = 2.
    space = next(s for s in gpu_spaces(small, target) if s.pipeline == "TileAndFuse")
    assert space.loop_bounds == (2, 256, 512)
    # An M tile above the padded M is IREE's own "wg_0 <= dim_0", read at M = 2.
    assert violated_constraints(small, target, space, {"wg_0": 48}) == ["wg_0 <= dim_0"]
    aligned = next(s for s in gpu_spaces(raised, target) if s.pipeline == "TileAndFuse")
    rows = sorted(_knob_rows(space, enumerate_space(space)))
    assert rows and rows == sorted(_knob_rows(aligned, enumerate_space(aligned)))
    source = tmp_path / "small.mlir"
    source.write_text(small.to_mlir())
    (problem,) = load_problems(source, target)
    cands = enumerate_candidates(problem, target)
    infos = cands.compilation_infos()
    assert len(infos) == len(rows)
    # M padded to its tile (16 or 32), as IREE pads its own config of an M of 5.
    assert all(re.search(r"padding = \[(\d+), .*workgroup = \[\1, ", info) for info in infos)
    for row in (0, len(cands) // 2, len(cands) - 1):
        _applies_and_compiles(problem, infos[row], source, tmp_path / f"m{row}")
    # Batched, IREE emits none rather than crash; raised it would crash: the batch-less op is
    # raised, and the batch loop gets a tile of 1.
    batched = enumerate_candidates(Problem.batch_matmul(3, 2, 256, 512, "f16", out_type="f32"),
                                   target)
    assert len(batched) == len(rows) and (batched.table["tile_b"] == 1).all()


STRIDED_CONV = Path(__file__).parent / "fixtures" / "conv_stride2_f32.mlir"


def test_unaligned_igemm_convolution_candidates_are_padded_and_compile(tmp_path: Path) -> None:
    """A stride-2 convolution to a 28 x 28 image: IREE's own implicit-GEMM config pads
    (`padding`, and `padding_conv` over the convolution's loops); unpadded candidates fail to
    compile ("'tensor.expand_shape' op expected dimension ..."). Candidates carry both."""
    from dispatchtune import load_problems

    target = get_target("gfx942")
    source = tmp_path / "conv.mlir"
    source.write_text(STRIDED_CONV.read_text())
    (default,) = applied_configs(source, target, None)
    assert "padding_conv = [" in default
    (problem,) = load_problems(source, target)
    cands = enumerate_candidates(problem, target)
    t = cands.table
    rows = t.index[t["igemm"] == 1]
    first, last = int(rows[0]), int(rows[-1])
    for row in (first, last):
        info = cands.compilation_info(row)
        assert "padding = [" in info and "padding_conv = [" in info
        _applies_and_compiles(problem, info, source, tmp_path / f"c{row}")


RGB_STEM = Path(__file__).parent / "fixtures" / "conv_rgb_stem_nchw_f32.mlir"


def test_an_rgb_stem_gets_implicit_gemm_candidates_with_k_padded(tmp_path: Path) -> None:
    """An RGB 3x3 stem's implicit GEMM has K = 27, a multiple of no intrinsic K: IREE 3.13's
    constraints then admit no implicit-GEMM row (their K alignment is over the raw K), while its
    own default config of the op is an implicit GEMM with K padded. Every direct row of such a
    strided conv crashes IREE ("missing critical dimension"), so the op had nothing that builds.
    The K alignment is dropped for that set only; its rows have partial K tiles, are padded and
    compile."""
    from dispatchtune import load_problems

    target = get_target("gfx942")
    source = tmp_path / "stem.mlir"
    source.write_text(RGB_STEM.read_text())
    (default,) = applied_configs(source, target, None)
    assert "use_igemm_convolution = true" in default and "padding = [" in default
    (problem,) = load_problems(source, target)
    cands = enumerate_candidates(problem, target)
    t = cands.table
    igemm = t[t["igemm"] == 1]
    assert len(igemm) and (27 % igemm["tile_k"] != 0).all()
    # The set's own rows violate none of its (kept) assertions.
    space = next(s for s in gpu_spaces(problem, target) if s.igemm)
    assert space.padded_k
    own = enumerate_space(space).iloc[0]
    values = {k: int(own[f"knob_{k}"]) for k in space.knobs}
    assert violated_constraints(problem, target, space, values) == []
    for row in (int(igemm.index[0]), int(igemm.index[-1])):
        info = cands.compilation_info(row)
        assert "padding = [" in info
        _applies_and_compiles(problem, info, source, tmp_path / f"s{row}")
    # An aligned K keeps IREE's K alignment: every K tile divides K (3x3 x 32 channels = 288).
    aligned = enumerate_candidates(load_problems(STRIDED_CONV, target)[0], target).table
    assert (288 % aligned.loc[aligned["igemm"] == 1, "tile_k"] == 0).all()


def _applies_and_compiles(problem: Problem, info: str, source: Path, stem: Path) -> None:
    """A spec of one candidate is applied exactly by IREE and the source compiles with it."""
    target = get_target("gfx942")
    spec = write_spec(tuning_spec([(problem, info)]), stem.with_suffix(".spec.mlir"))
    assert any(config_applied(info, got) for got in applied_configs(source, target, spec))
    proc = run_tool("iree-compile", [str(source), *target.compile_flags,
                                     *target.tuning_spec_flags(spec), "-o",
                                     str(stem.with_suffix(".vmfb"))])
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_no_constraints_names_missing_element_types_before_collapsed_loops() -> None:
    """An f32 attention on gfx1100 (no f32 intrinsic) whose dispatch keeps a loop IREE collapses:
    the reason is the element type, not the loop (the loop's reason used to come first, though
    the same attention is tunable on gfx942)."""
    from dispatchtune.search.gpu_source import why_no_constraints

    problem = Problem.attention(4, 128, 64, 64, 128, "f32")
    for target, expected in (("gfx1100", "no MMA intrinsic of gfx1100 takes f32"),
                             ("gfx942", "its dispatch keeps loop(s) d1")):
        reason = why_no_constraints(problem, get_target(target), problem, (1,))
        assert reason.startswith(expected), (target, reason)
