"""Expert tuning specs: ops rebuilt, configurations read by meaning, found in the real gfx942 space."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dispatchtune.datasets.expert_specs import (
    SDXL_ATTENTION_SHAPES,
    current_intrinsic,
    expert_columns,
    load_spec_dir,
    load_spec_file,
    named_architecture,
    named_partitions,
    named_product,
)
from dispatchtune.errors import InputError
from dispatchtune.problem import Problem
from dispatchtune.targets import get_target

FIXTURES = Path(__file__).parent / "fixtures" / "expert_specs"


def test_current_syntax_vectordistribute() -> None:
    entries = {e.matcher: e for e in load_spec_file(FIXTURES / "punet_vectordistribute.mlir")}
    # The shape-free attention matcher becomes one entry per SDXL attention shape it accepts.
    attention = [e for m, e in entries.items() if m.startswith("match_attention_f16[")]
    assert [e.problem.loop_sizes for e in attention if e.problem] == list(SDXL_ATTENTION_SHAPES)
    mmt = entries["match_mmt_8192x640x640"]
    assert mmt.problem is not None and mmt.config is not None
    assert mmt.problem.gemm_shape == (1, 8192, 640, 640)
    assert mmt.problem.element_types == ("i8", "i8", "i32")
    assert mmt.config.syntax == "current" and mmt.config.waves_per_eu == 0
    assert expert_columns(mmt) == {
        "pipeline": "VectorDistribute", "intrinsic": "MFMA_I32_16x16x32_I8", "tile_b": 1,
        "tile_m": 256, "tile_n": 64, "tile_k": 64, "subgroups_m": 8, "subgroups_n": 1,
        "workgroup_threads": 512,
    }
    # dims_equal %m, [-1, 1024]: the dynamic batch becomes 2, the M tile spans both loops.
    broadcast = entries["match_broadcast_rhs_mmt_Bx1024x1280x1280"]
    assert broadcast.problem is not None
    assert broadcast.problem.sizes("m") == (2, 1024)
    cols = expert_columns(broadcast)
    assert (cols["tile_m"], cols["tile_n"], cols["subgroups_m"], cols["subgroups_n"]) == (64, 160, 2, 2)


def test_tileandfuse_2025_syntax_counts_subgroups_from_subgroup_tiles() -> None:
    entries = {e.matcher: e for e in load_spec_file(FIXTURES / "flux_tileandfuse_2025.mlir")}
    square = entries["match_contraction_4096x3072x3072_bf16xbf16xf32"]
    assert square.config is not None and square.config.syntax == "tileandfuse-2025"
    assert square.config.waves_per_eu == 2
    # workgroup [128, 192], subgroup [4, 6] intrinsics of 16x16, reduction 2 intrinsics of K=16.
    assert expert_columns(square) == {
        "pipeline": "TileAndFuse", "intrinsic": "MFMA_F32_16x16x16_BF16", "tile_b": 1,
        "tile_m": 128, "tile_n": 192, "tile_k": 32, "subgroups_m": 2, "subgroups_n": 2,
        "workgroup_threads": 256,
    }
    # Two N loops (72 x 128): only the innermost counts in intrinsics (subgroup [4, 2, 2, 0]).
    split_n = entries["match_contraction_72x4096x3072_bf16xbf16xf32"]
    assert split_n.problem is not None and split_n.problem.sizes("n") == (72, 128)
    cols = expert_columns(split_n)
    assert (cols["tile_m"], cols["tile_n"], cols["subgroups_m"], cols["subgroups_n"]) == (256, 128, 8, 1)


def test_2024_syntax_mapped_by_meaning() -> None:
    assert current_intrinsic("MFMA_F16_16x16x16_F32") == "MFMA_F32_16x16x16_F16"
    assert current_intrinsic("MFMA_I8_32x32x16_I32") == "MFMA_I32_32x32x16_I8"
    assert current_intrinsic("MFMA_F32_16x16x16_F16") == "MFMA_F32_16x16x16_F16"
    # RDNA3's WMMA in both older spellings is 3.13's WMMAR3; gfx1250's WMMA (16x16x32) and
    # RDNA4's WMMAR4 keep their names.
    assert current_intrinsic("WMMA_F16_16x16x16_F32") == "WMMAR3_F32_16x16x16_F16"
    assert current_intrinsic("WMMA_F32_16x16x16_F16") == "WMMAR3_F32_16x16x16_F16"
    assert current_intrinsic("WMMA_I32_16x16x16_I8") == "WMMAR3_I32_16x16x16_I8"
    assert current_intrinsic("WMMA_F32_16x16x32_F16") == "WMMA_F32_16x16x32_F16"
    assert current_intrinsic("WMMAR4_F32_16x16x16_F16") == "WMMAR4_F32_16x16x16_F16"
    entries = {e.matcher: e for e in load_spec_file(FIXTURES / "sdxl_2024.mlir")}
    assert "match_mmt_f16_f16_f32" not in entries  # a helper matcher without a configuration
    mmt = entries["match_mmt_8192x640x640"]  # shapes from cast_compatible_type + the helper
    assert mmt.problem is not None and mmt.problem.gemm_shape == (1, 8192, 640, 640)
    assert expert_columns(mmt) == {
        "pipeline": "VectorDistribute", "intrinsic": "MFMA_F32_16x16x16_F16", "tile_b": 1,
        "tile_m": 64, "tile_n": 160, "tile_k": 64, "subgroups_m": 4, "subgroups_n": 1,
        "workgroup_threads": 256,
    }
    conv = entries["match_conv_2d_nhwc_hwcf_2x64x64x640x3x3x640"]
    assert conv.problem is not None and conv.problem.kind == "convolution"
    # tile_sizes [1, 1, 464, 320, 1, 1, 80]: 464 >= OW = 64 is the whole loop (IREE clamps it).
    cols = expert_columns(conv)
    assert (cols["tile_m"], cols["tile_n"], cols["tile_k"]) == (64, 320, 80)
    # A named batch matmul (2024 PadAndVectorDistribute = VectorDistribute with padding today).
    bmm = entries["match_batch_matmul_64x968x320x640"]
    assert bmm.problem is not None and bmm.problem.gemm_shape == (64, 968, 320, 640)
    assert bmm.notes == ("batch matmul",)
    assert expert_columns(bmm) == {
        "pipeline": "VectorDistribute", "intrinsic": "MFMA_F32_16x16x16_F16", "tile_b": 1,
        "tile_m": 128, "tile_n": 64, "tile_k": 64, "subgroups_m": 4, "subgroups_n": 1,
        "workgroup_threads": 256,
    }


def test_expert_outside_the_space_names_the_attribute() -> None:
    """punet's 256x64 tile with 512 threads breaks IREE's 'threads <= larger tile' filter."""
    from dispatchtune.benchmarks.expert_order import expert_mask, iree_exclusion
    from dispatchtune.search import enumerate_candidates

    entries = {e.matcher: e for e in load_spec_file(FIXTURES / "punet_vectordistribute.mlir")}
    entry = entries["match_mmt_8192x640x640"]
    assert entry.problem is not None
    filtered = enumerate_candidates(entry.problem, "gfx942", heuristic_filters=True).table
    mask, why = expert_mask(filtered, expert_columns(entry))
    assert not mask.any() and why.startswith("subgroups_m=8")
    # The whole space, the default, holds it.
    assert expert_mask(enumerate_candidates(entry.problem, "gfx942").table,
                       expert_columns(entry))[0].any()
    # IREE's own words: the assertion its source labels a heuristic filter. Without the filters
    # the expert is a candidate.
    assert entry.config is not None
    assert iree_exclusion(entry.problem, entry.config) == "wg_size_x <= wg_m OR wg_size_x <= wg_n"
    whole = enumerate_candidates(entry.problem, "gfx942", heuristic_filters=False).table
    assert expert_mask(whole, expert_columns(entry))[0].any()


def test_implicit_gemm_expert_outside_the_space_names_the_constraint() -> None:
    """An implicit-GEMM config states IREE's implicit-GEMM loops, not the convolution's: its
    knobs are read against that set, so IREE's own reason is named (3.13 pads 48 output rows
    to 64, and a row tile of 6 does not divide 64), and an admitted tile is a candidate."""
    from dispatchtune.benchmarks.expert_order import expert_mask, iree_exclusion
    from dispatchtune.search import enumerate_candidates

    entries = {e.matcher: e for e in load_spec_file(FIXTURES / "implicit_gemm_convolution.mlir")}
    outside, inside = entries["match_conv_rows_6"], entries["match_conv_rows_2"]
    for entry in (outside, inside):
        assert entry.problem is not None and entry.config is not None
        assert expert_columns(entry)["igemm"] == 1
    assert expert_columns(outside)["tile_m"] == 96 and expert_columns(outside)["tile_k"] == 32
    assert outside.problem is not None and outside.config is not None
    table = enumerate_candidates(outside.problem, "gfx942", heuristic_filters=False).table
    assert not expert_mask(table, expert_columns(outside))[0].any()
    assert iree_exclusion(outside.problem, outside.config, False) == "dim_1 must be divisible by wg_1"
    assert inside.problem is not None and inside.config is not None
    table = enumerate_candidates(inside.problem, "gfx942", heuristic_filters=False).table
    assert expert_mask(table, expert_columns(inside))[0].any()
    assert iree_exclusion(inside.problem, inside.config, False) == ""


def test_small_and_multi_m_contraction_experts_in_the_space_or_told_why_not() -> None:
    """An M of 2 (no constraints from IREE 3.13 itself) has a space that holds the tuner's
    padded config; a multi-M expert tiling the loop IREE collapses is outside, and the report
    names that loop, not IREE's assertions on the loops left in."""
    from dispatchtune.benchmarks.expert_order import expert_mask, iree_exclusion
    from dispatchtune.search import enumerate_candidates

    entries = {e.matcher: e for e in
               load_spec_file(FIXTURES / "small_and_multi_m_contractions.mlir")}
    for name, inside in (("match_m2", True), ("match_m6x16_outer_1", True),
                         ("match_m6x16_outer_2", False)):
        entry = entries[name]
        assert entry.problem is not None and entry.config is not None
        table = enumerate_candidates(entry.problem, "gfx942", heuristic_filters=False).table
        assert expert_mask(table, expert_columns(entry))[0].any() == inside, name
        reason = iree_exclusion(entry.problem, entry.config, False)
        assert reason == ("" if inside else "tile 2 on d0, a loop candidates tile by 1 (IREE "
                          "collapses it into the next loop when it compiles the op alone)"), name


def _expert_order(tmp_path: Path, fixture: str, *args: str, timeout: float = 900
                  ) -> subprocess.CompletedProcess[str]:
    """`python benchmarks/expert_order.py SPEC_DIR ARGS...` as a subprocess from the project root,
    SPEC_DIR (`tmp_path/specs`) holding a copy of one fixture spec file."""
    specs = tmp_path / "specs"
    specs.mkdir(exist_ok=True)
    (specs / fixture).write_text((FIXTURES / fixture).read_text())
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "benchmarks/expert_order.py", str(specs), *args],
                          cwd=root, capture_output=True, text=True, timeout=timeout)


def test_expert_order_command_as_the_readme_shows(tmp_path: Path) -> None:
    """`python benchmarks/expert_order.py SPEC_DIR -o out/whole --no-heuristic-filters`, as a
    subprocess: a report with each expert's place, and IREE's reason for the one outside."""
    name = "implicit_gemm_convolution.mlir"
    proc = _expert_order(tmp_path, name, "-o", str(tmp_path / "whole"), "--no-heuristic-filters")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = (tmp_path / "whole" / "report.md").read_text()
    assert f"| {name} | 2 | 2 | 1 |" in report  # matchers, enumerated, in the space
    assert "`match_conv_rows_6`: igemm=1" in report and "dim_1 must be divisible by wg_1" in report
    # IREE's own default of each dispatch, placed in the same orders or told why not.
    assert "## IREE's default configuration" in report
    positions = pd.read_csv(tmp_path / "whole" / "positions.csv")
    assert positions["default_status"].str.match(r"in space|not in space: .+").all()
    found = positions[positions["default_status"] == "in space"]
    assert ((found["model_default_fraction"] > 0) & (found["model_default_fraction"] <= 1)).all()
    # `--model FILE` ranks `model` with that file: the installed prior's own file, the same order.
    installed = Path(__file__).resolve().parents[1] / "costmodel" / "models" / "gfx942.json"
    proc = _expert_order(tmp_path, name, "-o", str(tmp_path / "file"), "--no-heuristic-filters",
                         "--orders", "model", "--model", str(installed))
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = pd.read_csv(tmp_path / "file" / "positions.csv")
    pd.testing.assert_series_equal(again["model_position"], positions["model_position"])
    proc = _expert_order(tmp_path, name, "-o", str(tmp_path / "x"), "--model",
                         str(tmp_path / "missing.json"), timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "missing.json" in proc.stderr


def test_expert_order_on_another_gpu_places_its_iree_defaults(tmp_path: Path) -> None:
    """`--target gfx950`: the dispatches enumerated and featurised for that GPU, IREE's gfx950
    default of each placed in the (gfx942) prior's and the heuristic's orders."""
    name = "unet_fp16_vectordistribute.mlir"
    proc = _expert_order(tmp_path, name, "-o", str(tmp_path / "out"), "--target", "gfx950",
                         "--orders", "model,heuristic", "--cache", str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "report.md").read_text().startswith(
        "# Expert configurations in the candidate order of gfx950")
    (row,) = pd.read_csv(tmp_path / "out" / "positions.csv").to_dict("records")
    assert str(row["features_for"]).startswith("gfx950") and row["default_status"] == "in space"
    for order in ("model", "heuristic"):
        assert 1 <= float(row[f"{order}_default_position"]) <= float(row["n"])
    assert list((tmp_path / "c").glob("*.gfx950.default.json"))  # cached apart from gfx942's
    proc = _expert_order(tmp_path, name, "-o", str(tmp_path / "x"), "--target", "host", timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: host is not a GPU target"
    proc = _expert_order(tmp_path, name, "-o", str(tmp_path / "x"), "--target", "gfx9999",
                         timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no GPU description of target 'gfx9999'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_an_rdna3_spec_file_is_enumerated_on_gfx1100(tmp_path: Path) -> None:
    """A file whose expert uses RDNA3's WMMA (under its early-2025 name) is enumerated and
    featurised on gfx1100, where its expert is a candidate; so is a file whose name states a
    Radeon product or an architecture."""
    from dispatchtune.benchmarks.expert_order import file_architecture

    name = "rdna3_wmma_matmul.mlir"
    entries = load_spec_file(FIXTURES / name)
    assert entries[0].config is not None
    assert entries[0].config.intrinsic == "WMMAR3_F32_16x16x16_F16"
    assert file_architecture(name, entries) == "gfx1100"
    assert file_architecture("unet_rx7900xtx.mlir", []) == "gfx1100"
    assert file_architecture("unet_r9700.mlir", []) == "gfx1201"
    assert file_architecture("attention_and_matmul_spec_gfx1201.mlir", []) == "gfx1201"
    proc = _expert_order(tmp_path, name, "-o", str(tmp_path / "out"), "--no-heuristic-filters",
                         "--orders", "heuristic,shipped", "--cache", str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = pd.read_csv(tmp_path / "out" / "positions.csv").to_dict("records")
    assert str(row["features_for"]).startswith("gfx1100") and row["status"] == "in space"
    assert (row["expert_intrinsic"], row["expert_workgroup_threads"]) == (
        "WMMAR3_F32_16x16x16_F16", 128)
    assert 1 <= row["heuristic_position"] <= row["n"]
    # What `tune` does on gfx1100: no model ships for RDNA, so the heuristic's order.
    assert row["shipped_position"] == row["heuristic_position"]


def test_a_gfx950_spec_file_is_enumerated_on_gfx950(tmp_path: Path) -> None:
    """A file whose experts use an intrinsic only gfx950 has (or whose name is a gfx950
    product) is enumerated and featurised on gfx950, where its expert is a candidate; on gfx942
    it would be "not in space"."""
    from dispatchtune.benchmarks.expert_order import file_architecture

    name = "gfx950_double_k_matmul.mlir"
    entries = load_spec_file(FIXTURES / name)
    assert file_architecture(name, entries) == "gfx950"
    punet = load_spec_file(FIXTURES / "punet_vectordistribute.mlir")
    assert file_architecture("punet_vectordistribute.mlir", punet) == "gfx942"
    assert file_architecture("punet_mi355x.mlir", []) == "gfx950"  # the product its name states
    proc = _expert_order(tmp_path, name, "-o", str(tmp_path / "out"), "--no-heuristic-filters",
                         "--orders", "model,heuristic,shipped", "--cache", str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = pd.read_csv(tmp_path / "out" / "positions.csv").to_dict("records")
    assert str(row["features_for"]).startswith("gfx950") and row["status"] == "in space"
    assert row["shipped_position"] == row["model_position"]  # gfx950 takes the gfx942 prior
    assert row["expert_intrinsic"] == "MFMA_F32_16x16x32_BF16"
    row_position = row["model_position"]
    # Forced onto gfx90a, which lacks that intrinsic: no expert in any space, still a report.
    proc = _expert_order(tmp_path, name, "-o", str(tmp_path / "gfx90a"), "--target", "gfx90a",
                         "--orders", "model", "--cache", str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = pd.read_csv(tmp_path / "gfx90a" / "positions.csv").to_dict("records")
    assert row["status"] == "not in space" and str(row["excluded_by"]).startswith("intrinsic=")
    assert (tmp_path / "gfx90a" / "positions.png").exists()
    # One spec file named instead of a directory: the same report, without warnings.
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-W", "error::UserWarning",
                           "benchmarks/expert_order.py", str(tmp_path / "specs" / name), "-o",
                           str(tmp_path / "one"), "--no-heuristic-filters", "--orders",
                           "model,heuristic", "--cache", str(tmp_path / "c")],
                          cwd=root, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr[-2000:]
    (one,) = pd.read_csv(tmp_path / "one" / "positions.csv").to_dict("records")
    assert one["status"] == "in space" and one["model_position"] == row_position


def test_iree_default_attention_config_is_read_over_its_collapsed_batch() -> None:
    """IREE configures a [2, 10] batch attention as one batch loop of 20 with the two matmuls'
    configs inside (`decomposition_config`): read as the candidate it is."""
    from dispatchtune.benchmarks.expert_order import expert_mask
    from dispatchtune.datasets.expert_specs import attention_problem, configuration_columns
    from dispatchtune.search import enumerate_candidates

    problem = attention_problem((2, 10, 4096, 64, 64, 64), "f16")
    qk = ("mma_kind = #iree_gpu.virtual_mma_layout<VMFMA_F32_16x16x32_F16, col_major = true>, "
          "promote_operands = [0, 1], subgroup_basis = [[1, 4, 1, 1, 1], [0, 1, 3, 4]]")
    pv = ("mma_kind = #iree_gpu.mma_layout<MFMA_F32_16x16x16_F16, col_major = true>, "
          "promote_operands = [1], subgroup_basis = [[1, 4, 1, 1, 1], [0, 1, 2, 4]]")
    text = (
        "#iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{"
        f"decomposition_config = {{pv_attrs = {{lowering_config = #iree_gpu.lowering_config<{{{pv}}}>}}, "
        f"qk_attrs = {{lowering_config = #iree_gpu.lowering_config<{{{qk}}}>}}}}, "
        "promote_operands = [0, 1, 2], reduction = [0, 0, 0, 0, 64], workgroup = [1, 64, 64, 0, 0]}>, "
        "translation_info = <pipeline = #iree_gpu.pipeline<VectorDistribute> "
        "workgroup_size = [256, 1, 1] subgroup_size = 64>>")
    columns = configuration_columns(text, problem)
    assert columns == {
        "pipeline": "VectorDistribute", "intrinsic": "VMFMA_F32_16x16x32_F16", "tile_b": 1,
        "tile_m": 64, "tile_n": 64, "tile_k": 64, "subgroups_m": 4, "subgroups_n": 1,
        "workgroup_threads": 256, "workgroups": 20 * 4096 // 64,
        "pv_intrinsic": "MFMA_F32_16x16x16_F16",
    }
    mask, why = expert_mask(enumerate_candidates(problem, "gfx942").table, columns)
    assert mask.sum() == 1, why


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        load_spec_dir(tmp_path)
    with pytest.raises(InputError):
        load_spec_file(tmp_path / "missing.mlir")


def test_expert_configurations_are_found_in_the_real_space(tmp_path: Path) -> None:
    """Real IREE constraints + enumeration: both pipelines' expert configs are candidates."""
    from dispatchtune.benchmarks.expert_order import expected_position, expert_mask, heuristic_scores
    from dispatchtune.search import enumerate_candidates

    (vd,) = load_spec_file(FIXTURES / "unet_fp16_vectordistribute.mlir")
    tf = {e.matcher: e for e in load_spec_file(FIXTURES / "flux_tileandfuse_2025.mlir")}
    for entry in (vd, tf["match_contraction_4096x3072x3072_bf16xbf16xf32"]):
        assert entry.problem is not None
        table = enumerate_candidates(entry.problem, "gfx942").table
        mask, why = expert_mask(table, expert_columns(entry))
        assert mask.any(), why
        position = expected_position(heuristic_scores(entry.problem, table, get_target("gfx942")),
                                     mask)
        assert 1 <= position <= len(table)


def test_attention_expert_read_by_meaning_and_found_in_the_real_space() -> None:
    """Decomposition config read with IREE's bindings; the expert is a candidate of its space."""
    from dispatchtune.benchmarks.expert_order import expert_mask
    from dispatchtune.search import enumerate_candidates

    entries = {e.matcher: e for e in load_spec_file(FIXTURES / "punet_vectordistribute.mlir")}
    entry = entries["match_attention_f16[2x20x1024x64x64x64]"]
    assert entry.problem is not None and entry.problem.kind == "attention"
    assert entry.problem.operand_shapes[2] == (2, 20, 64, 64)  # V is [B, H, N, K2]
    cols = expert_columns(entry)
    assert cols == {
        "pipeline": "VectorDistribute", "intrinsic": "VMFMA_F32_32x32x16_F16", "tile_b": 1,
        "tile_m": 128, "tile_n": 64, "tile_k": 64, "subgroups_m": 4, "subgroups_n": 1,
        "workgroup_threads": 256, "workgroups": 2 * 20 * 1024 // 128,
        "pv_intrinsic": "MFMA_F32_32x32x8_F16",
    }
    table = enumerate_candidates(entry.problem, "gfx942").table
    mask, why = expert_mask(table, cols)
    # The P x V intrinsic tells the expert from its twin; its pair keeps P in registers.
    assert mask.sum() == 1, why
    assert table.loc[mask, "p_relayout"].tolist() == [0]


def test_older_syntax_generations_and_skips_with_reasons() -> None:
    """Late-2024 / early-2025 spellings are read by meaning; the rest is skipped with a reason."""
    from dispatchtune.datasets.expert_specs import skip_reasons

    entries = {e.matcher: e for e in load_spec_file(FIXTURES / "generations.mlir")}
    late = entries["match_mmt_late2024"]  # subgroup_m/n_count in the lowering config
    assert late.problem is not None and late.problem.sizes("m") == (2, 1024)
    assert late.config is not None and late.config.syntax == "modernised"
    assert late.config.waves_per_eu == 2
    # The commented-out 16x16 configuration above the real one is not read.
    assert expert_columns(late) == {
        "pipeline": "VectorDistribute", "intrinsic": "MFMA_F32_16x16x16_F16", "tile_b": 1,
        "tile_m": 128, "tile_n": 128, "tile_k": 64, "subgroups_m": 2, "subgroups_n": 2,
        "workgroup_threads": 256,
    }
    early = entries["match_mmt_early2025"]  # `pipeline = LLVMGPU...`, mma_schedule in the config
    assert early.config is not None and early.config.waves_per_eu == 1
    cols = expert_columns(early)
    assert (cols["intrinsic"], cols["subgroups_m"], cols["subgroups_n"]) == (
        "MFMA_F32_32x32x8_F16", 2, 4)
    assert entries["match_via_unknown_helper"].skipped.endswith("@not_defined_here, not in the file")
    assert entries["match_unknown_op"].skipped.endswith("root op linalg.softmax")
    assert "apply_op_config" not in entries  # no configuration yielded: not a matcher
    assert skip_reasons(entries.values()) == {
        "unsupported matcher form": 2, "transform-dialect script, no config": 1,
        "no compilation_info constant in the matcher": 1,
    }


def test_a_directory_with_an_unreadable_file_keeps_the_others(tmp_path: Path) -> None:
    (tmp_path / "bad.mlir").write_bytes(b"\xff\xfe")
    (tmp_path / "good.mlir").write_text((FIXTURES / "unet_fp16_vectordistribute.mlir").read_text())
    bad, good = load_spec_dir(tmp_path)
    assert bad.matcher == "*" and bad.skipped.startswith("unreadable file:")
    assert good.usable
    # A readable file without a matcher is reported too, not left out of the entries.
    (tmp_path / "junk.mlir").write_text("not a tuning spec {{{\n")
    (tmp_path / "library.mlir").write_text(
        "module attributes {transform.with_named_sequence} {\n"
        "  transform.named_sequence @helper(%op: !transform.any_op {transform.readonly}) {\n"
        "    transform.yield\n  }\n}\n")
    by_file = {e.file: e for e in load_spec_dir(tmp_path)}
    assert by_file["junk.mlir"].skipped == "no tuning matcher: no transform.named_sequence"
    assert by_file["library.mlir"].skipped == (
        "no tuning matcher: no named sequence yields a configuration")
    assert not by_file["junk.mlir"].usable and by_file["good.mlir"].usable


@pytest.mark.parametrize(
    "problem",
    [
        # Batch 1: IREE folds the unit loop, so the direct (6 entries) and implicit-GEMM (4)
        # configurations tile fewer loops than the convolution has (7).
        Problem.conv2d_nhwc_hwcf(1, 16, 16, 64, 64, 3, 3, "f16", "f16", "f32", stride=2),
        Problem.matmul(256, 512, 128, "f16", "f16", "f32"),
        # Not an SDXL shape and not SDXL's layout: read from the matcher's own maps and sizes.
        Problem.attention(4, 512, 64, 64, 512, "f16"),
    ],
    ids=lambda p: p.kind,
)
def test_specs_in_iree_3_13_matcher_form_read_back_as_their_candidates(
    problem: Problem, tmp_path: Path
) -> None:
    """A spec as IREE 3.13's bindings print it (`transform.iree.match.contraction` /
    `convolution` / `online_attention` + `dims_equal`, dispatchtune's own output) reads back as
    the dispatch it names and the candidate it configures: one per pipeline and lowering."""
    from dispatchtune.benchmarks.expert_order import expert_mask
    from dispatchtune.ir.spec import tuning_spec
    from dispatchtune.search import enumerate_candidates

    space = enumerate_candidates(problem, "gfx942")
    firsts = space.table.groupby(["pipeline", "igemm"]).head(1).index
    assert len(firsts) >= (3 if problem.kind == "convolution" else 1)
    for row in firsts:
        path = tmp_path / f"spec_{row}.mlir"
        path.write_text(tuning_spec([(problem, space.compilation_info(int(row)))]))
        entries = load_spec_file(path)
        usable = [e for e in entries if e.usable]
        assert len(usable) == 1, [e.skipped for e in entries]
        (entry,) = usable
        assert entry.problem is not None and entry.problem.key == problem.key
        assert entry.matcher.startswith("match_")  # one entry, no per-SDXL-shape expansion
        columns = expert_columns(entry)
        mask, why = expert_mask(space.table, columns)
        assert mask[row], why
        if problem.kind == "convolution":  # the lowering and image split are read too
            expected = space.table.loc[row, ["igemm", "tile_oh", "tile_ow"]].tolist()
            assert [columns["igemm"], columns["tile_oh"], columns["tile_ow"]] == expected
    if problem.kind == "attention":
        # The spec matches attention in both forms: the second matcher is the same expert.
        assert [e.skipped for e in entries if not e.usable] == [
            "same dispatch and configuration as an earlier matcher"]


def test_a_masked_attention_matcher_that_names_no_mask_type_is_skipped() -> None:
    """The matcher names the mask's map but not its element type: skipped, saying so."""
    (entry,) = load_spec_file(FIXTURES / "masked_attention_no_mask_type.mlir")
    assert not entry.usable and "names no mask type" in entry.skipped, entry.skipped


def test_dag_matchers_rooted_at_other_convolutions() -> None:
    """A generic convolution (stride 2, dynamic input image) and a named NCHW one are rebuilt by
    classifying the parsed root op as IREE does; TileAndFuse's intrinsic K scales the channels."""
    entries = {e.matcher: e for e in load_spec_file(FIXTURES / "dag_convolutions.mlir")}
    generic = entries["match_generic_conv_s2"]
    assert generic.problem is not None, generic.skipped
    expected = Problem.conv2d_nhwc_hwcf(2, 16, 16, 64, 128, 3, 3, "f16", "f16", "f32", stride=2)
    assert generic.problem.key == expected.key
    assert generic.problem.operand_shapes[0] == (2, 33, 33, 64)  # sized from the output
    nchw = entries["match_nchw_conv"]
    assert nchw.problem is not None and nchw.config is not None, nchw.skipped
    assert nchw.problem.sizes("output_channel") == (128,)
    assert nchw.problem.sizes("input_channel") == (64,)
    assert nchw.problem.sizes("output_image") == (32, 32)
    assert nchw.config.reduction == (0, 0, 0, 0, 32, 1, 1)  # 2 intrinsics of K 16 over channels
    assert expert_columns(nchw) == {
        "pipeline": "TileAndFuse", "intrinsic": "MFMA_F32_16x16x16_F16", "tile_b": 1,
        "tile_m": 32, "tile_n": 64, "tile_k": 32, "subgroups_m": 2, "subgroups_n": 2,
        "workgroup_threads": 256, "igemm": 0, "tile_oh": 1, "tile_ow": 32,
    }


def test_a_shape_free_attention_matcher_keeps_its_own_layout() -> None:
    """No sizes named: one entry per SDXL shape, but in the matcher's layout (V is [B, H, K2, N]
    here, not the SDXL export's [B, H, N, K2])."""
    entries = [e for e in load_spec_file(FIXTURES / "shape_free_attention_v_not_transposed.mlir")
               if e.usable]
    assert [e.problem.loop_sizes for e in entries if e.problem] == list(SDXL_ATTENTION_SHAPES)
    first = entries[0].problem
    assert first is not None
    assert first.operand_shapes[2] == (2, 10, 4096, 64)  # V as the matcher lays it out
    assert expert_columns(entries[0])["tile_m"] == 128


@pytest.mark.parametrize(("file", "product"), [
    ("iree_testsuite_unet_fp16_mi308.mlir", "rocm:mi308x"),
    ("attention_and_matmul_spec_MI300A.mlir", "rocm:mi300a"),
    ("punet-int8-mi325x.mlir", "rocm:mi325x"),
    ("sdxl_scripts_fp16_2024.mlir", None),
    ("semi3000.mlir", None),
    ("sdxl_unet_rx7900xtx.mlir", "rocm:rx7900xtx"),
    ("spec-w7900-fp16.mlir", "rocm:w7900"),
    ("punet_r9700.mlir", "rocm:r9700"),
    ("rx7900_tuning.mlir", "rocm:rx7900"),  # IREE's to accept or refuse
    ("sdxl_scripts_int8_2024_gfx942.mlir", None),
])
def test_the_product_a_spec_file_names(file: str, product: str | None) -> None:
    assert named_product(file) == product


@pytest.mark.parametrize(("file", "architecture"), [
    ("sdxl_scripts_int8_gfx942_qpx_MI325.mlir", "gfx942"),
    ("attention_and_matmul_spec_gfx1100.mlir", "gfx1100"),
    ("gfx90a-unet.mlir", "gfx90a"),
    ("gfx9.mlir", None),
    ("agfx942.mlir", None),
])
def test_the_architecture_a_spec_file_names(file: str, architecture: str | None) -> None:
    assert named_architecture(file) == architecture


def test_experts_of_a_named_product_are_featurised_with_its_compute_units() -> None:
    """An MI308X file's experts see 80 CUs (IREE's table), the others gfx942's 304."""
    from dispatchtune.benchmarks.expert_order import feature_target

    mi308 = feature_target("iree_testsuite_unet_fp16_mi308.mlir")
    assert mi308.name == "rocm:mi308x" and mi308.gpu_facts().compute_units == 80
    plain = feature_target("sdxl_scripts_int8_2024.mlir")
    assert plain.name == "gfx942" and plain.gpu_facts().compute_units == 304
    # A product IREE does not know, or of another architecture, falls back to gfx942.
    assert feature_target("spec_mi250.mlir").name == "gfx942"


def test_early_2025_attention_matchers_and_the_matcher_iree_applies() -> None:
    """Attention matched by op name, `virtual_mma_layout<intrinsic = ...>` and subgroup counts in
    the decomposition are read; a general matcher listed after a specific one in `foreach_match`
    is skipped for the dispatches the specific one takes (IREE applies the first match)."""
    entries = {e.matcher: e for e in load_spec_file(FIXTURES / "early2025_attention_op_name.mlir")}
    specific = entries["match_f8_m_1024[2x20x1024x64x64x1024]"]
    assert specific.usable and specific.config is not None, specific.skipped
    assert specific.config.pv_intrinsic == "VMFMA_F32_16x16x32_F8E4M3FNUZ"
    assert specific.config.subgroup_counts == (4, 1)
    assert expert_columns(specific)["tile_m"] == 128
    shadowed = entries["match_f8_general[2x20x1024x64x64x1024]"]
    assert not shadowed.usable and "IREE applies match_f8_m_1024" in shadowed.skipped
    # M = 4096 is not 1024: the general matcher is the one applied there.
    general = entries["match_f8_general[2x10x4096x64x64x4096]"]
    assert general.usable and expert_columns(general)["tile_m"] == 64


def test_spring_2024_mfma_layouts_type_aliases_and_conv_pipeline() -> None:
    """`#iree_gpu.mfma_layout<F16_16x16x16_F32>` (operand type first, no family) is the current
    MFMA_F32_16x16x16_F16; `!type` aliases in a matched DAG are inlined; 2024's
    LLVMGPUConvVectorDistribute is VectorDistribute; and each expert lands in its space."""
    entries = {e.matcher: e for e in load_spec_file(FIXTURES / "spring2024_mfma_layout.mlir")}
    mmt = entries["match_mmt_1024x640x1280"]
    assert mmt.usable and mmt.config is not None and mmt.problem is not None, mmt.skipped
    assert mmt.problem.loop_sizes == (1024, 640, 1280)
    assert mmt.config.intrinsic == "MFMA_F32_16x16x16_F16"
    assert mmt.config.subgroup_counts == (2, 2) and mmt.config.pipeline == "VectorDistribute"
    conv = entries["match_conv_2x32x32x320x3x3x320"]
    assert conv.usable and conv.config is not None and conv.problem is not None, conv.skipped
    assert conv.problem.kind == "convolution" and conv.config.intrinsic == "MFMA_F32_32x32x8_F16"
    assert conv.config.pipeline == "VectorDistribute"
    from dispatchtune.benchmarks.expert_order import expert_mask
    from dispatchtune.search import enumerate_candidates

    table = enumerate_candidates(mmt.problem, "gfx942", heuristic_filters=False).table
    assert expert_mask(table, expert_columns(mmt))[0].sum() == 1


@pytest.mark.parametrize(("file", "partitions"), [
    ("attention_and_matmul_spec_punet_mi300_cpx.mlir", 8),
    ("spec_gfx942_qpx_MI325.mlir", 4),
    ("punet-DPX.mlir", 2),
    ("spec_mi300_none.mlir", 1),
    ("cpxfoo.mlir", 1),
])
def test_the_compute_partitions_a_spec_file_names(file: str, partitions: int) -> None:
    assert named_partitions(file) == partitions


def test_experts_tuned_on_a_partition_see_its_share_of_the_compute_units() -> None:
    from dispatchtune.benchmarks.expert_order import feature_target

    assert feature_target("spec_gfx942_qpx_MI325.mlir").gpu_facts().compute_units == 304 // 4
    assert feature_target("spec_mi308_cpx.mlir").gpu_facts().compute_units == 80 // 8


def test_attention_matched_by_an_included_helper_and_custom_kernels() -> None:
    """IREE's 2024-2025 default specs match any f16 attention in a helper and size it in the
    including matcher: read as the SDXL attentions the checks accept. A helper DAG in another
    layout, a matmul handed to a hand-written kernel and a horizontally fused contraction are
    skipped saying why."""
    entries = {e.matcher: e for e in load_spec_file(FIXTURES / "attention_via_helper.mlir")}
    # K is [?, ?, 64, 64]: only the cross-attentions (K2 = 64 text tokens) match.
    read = [e for e in entries.values() if e.usable]
    assert [e.problem.loop_sizes for e in read if e.problem] == [
        (2, 10, 4096, 64, 64, 64), (2, 20, 1024, 64, 64, 64)]
    assert expert_columns(read[0]) == {
        "pipeline": "VectorDistribute", "intrinsic": "VMFMA_F32_16x16x32_F16", "tile_b": 1,
        "tile_m": 64, "tile_n": 64, "tile_k": 64, "subgroups_m": 4, "subgroups_n": 1,
        "workgroup_threads": 256, "workgroups": 1280, "pv_intrinsic": "MFMA_F32_16x16x16_F16",
    }
    assert entries["match_attention_v_kn"].skipped.endswith(
        "a shape-free attention DAG in a layout other than the SDXL export's")
    assert entries["match_big_matmul_by_kernel"].skipped == (
        "custom lowering strategy, not a configuration of the space")
    assert entries["match_two_projections"].skipped == (
        "horizontally fused contraction: 2 outputs, no space (IREE 3.13 emits no constraints "
        "for it)")
    assert "any_f16_attention" not in entries  # helpers yield no configuration
