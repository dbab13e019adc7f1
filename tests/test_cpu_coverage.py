"""CPU coverage of the op kinds real exported models contain: SDPA attention (masked or not),
depthwise and NCHW convolutions enumerate, rank with finite scores and compile on llvm-cpu with the
requested configuration applied; what IREE cannot configure is refused in one line, before compiling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cpu_checks import tune_through_the_cli

from dispatchtune import Problem, load_problems, rank
from dispatchtune.errors import InputError, UnsupportedProblem
from dispatchtune.ir.spec import applied_configs, config_applied, tuning_spec, write_spec
from dispatchtune.search import enumerate_candidates
from dispatchtune.targets import get_target
from dispatchtune.toolchain import run_tool

FIXTURES = Path(__file__).parent / "fixtures"
HOST = get_target("host")


def _problem_file(tmp_path: Path, problem: Problem) -> Path:
    path = tmp_path / "op.mlir"
    path.write_text(problem.to_mlir())
    return path


def _check_applies_and_compiles(path: Path, tmp_path: Path, expected_pipeline: str) -> None:
    """Two candidates (heuristic first and last): each applied exactly, the first compiles."""
    (problem,) = load_problems(path, HOST)
    candidates = enumerate_candidates(problem, HOST)
    assert len(candidates) > 0
    assert set(candidates.table["pipeline"].astype(str)) == {expected_pipeline}
    ordered = rank(candidates, order="heuristic")
    assert np.isfinite(ordered["score"].to_numpy(dtype=float)).all()
    rows = [int(ordered.candidate_id.iloc[0]), int(ordered.candidate_id.iloc[-1])]
    for i, row in enumerate(rows):
        info = candidates.compilation_info(row)
        spec = write_spec(tuning_spec([(problem, info)]), tmp_path / f"spec{i}.mlir")
        applied = applied_configs(path, HOST, spec)
        assert any(config_applied(info, got) for got in applied), (info, applied)
    flags = HOST.tuning_spec_flags(tmp_path / 'spec0.mlir')
    args = [str(path), *HOST.compile_flags, *flags, "-o", str(tmp_path / "op.vmfb")]
    proc = run_tool("iree-compile", args)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_attention_with_mask_applies_and_compiles(tmp_path: Path) -> None:
    problem = Problem.attention(2, 64, 32, 32, 64, "f32", mask_type="i1")
    _check_applies_and_compiles(_problem_file(tmp_path, problem), tmp_path,
                                "LinalgExtTileAndVectorize")


def test_attention_without_mask_applies(tmp_path: Path) -> None:
    path = _problem_file(tmp_path, Problem.attention(2, 64, 32, 32, 64, "f32"))
    (problem,) = load_problems(path, HOST)
    assert problem.op_name == "iree_linalg_ext.online_attention" and not problem.mask_map
    info = enumerate_candidates(problem, HOST).compilation_info(0)
    spec = write_spec(tuning_spec([(problem, info)]), tmp_path / "spec.mlir")
    assert any(config_applied(info, got) for got in applied_configs(path, HOST, spec))


def test_depthwise_conv_applies_and_compiles(tmp_path: Path) -> None:
    _check_applies_and_compiles(FIXTURES / "cpu_depthwise_nhwc_f32.mlir", tmp_path,
                                "ConvTileAndDecomposeExpert")


def test_nchw_conv_applies_and_compiles(tmp_path: Path) -> None:
    _check_applies_and_compiles(FIXTURES / "cpu_conv_nchw_f32.mlir", tmp_path,
                                "ConvTileAndDecomposeExpert")


def test_attention_vector_limit_holds_for_both_products() -> None:
    """C4 on Q x K^T (vec_m x red_k2 x K1) and P x V (vec_m x vec_n x red_k2)."""
    problem = Problem.attention(4, 128, 64, 64, 128, "f32")
    table = enumerate_candidates(problem, HOST).table
    limit = HOST.cpu_facts().max_vector_bytes // 4
    assert int((table["vec_m"] * table["vec_n"] * 64).max()) < limit  # vec_n is red_k2 here


def test_masked_problem_round_trips_and_keeps_unmasked_keys() -> None:
    masked = Problem.attention(2, 64, 32, 32, 64, "f32", mask_type="i1")
    assert Problem.from_dict(masked.to_dict()) == masked
    assert masked.mask_shape == (2, 64, 64)
    plain = Problem.attention(2, 64, 32, 32, 64, "f32")
    assert "mask_map" not in plain.to_dict() and plain.key != masked.key


def _pooling() -> Problem:
    """ResNet's max pooling as IREE sees it at batch 1: channels are a batch loop."""
    maps = (
        "(d0, d1, d2, d3, d4) -> (d0, d1 * 2 + d3, d2 * 2 + d4)",
        "(d0, d1, d2, d3, d4) -> (d3, d4)",
        "(d0, d1, d2, d3, d4) -> (d0, d1, d2)",
    )
    return Problem(
        kind="convolution", loop_sizes=(64, 28, 28, 3, 3),
        dims={"batch": (0,), "output_image": (1, 2), "filter_loop": (3, 4)},
        element_types=("f32", "f32", "f32"),
        operand_shapes=((64, 57, 57), (3, 3), (64, 28, 28)), indexing_maps=maps,
        strides=(2, 2), dilations=(1, 1),
    )


@pytest.mark.parametrize(("problem", "message"), [(_pooling(), "not pooling")])
def test_unsupported_problems_are_refused_in_one_line(problem: Problem, message: str) -> None:
    with pytest.raises(UnsupportedProblem, match=message) as info:
        enumerate_candidates(problem, HOST)
    assert isinstance(info.value, InputError) and "\n" not in str(info.value)


def _run(vmfb: Path, inputs: list[str]) -> np.ndarray:
    out = vmfb.with_suffix(".npy")
    args = [f"--module={vmfb}", "--device=local-sync", *inputs, f"--output=@{out}"]
    proc = run_tool("iree-run-module", args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return np.load(out)


def test_unit_batch_conv_from_ir_applies_compiles_and_computes_the_same(tmp_path: Path) -> None:
    """IREE 3.13 matches specs on the batch-less op and then rebuilds it with a unit batch loop,
    dropping the config; the spec rebuilds it first and configures the 7-loop op."""
    source = (FIXTURES / "cpu_conv_nchw_f32.mlir").read_text()
    for shape in ("16x18x18", "32x16x16"):
        source = source.replace(f"tensor<2x{shape}", f"tensor<1x{shape}")
    path = tmp_path / "conv_b1.mlir"
    path.write_text(source)
    (problem,) = load_problems(path, HOST)
    assert problem.size("batch") == 1 and not problem.loops("batch") and problem.unit_batch_conv
    _check_applies_and_compiles(path, tmp_path, "ConvTileAndDecomposeExpert")
    info = enumerate_candidates(problem, HOST).compilation_info(0)
    assert info.count(", ") >= 3 * 6  # seven entries per list: the re-expanded op's loops
    rng = np.random.default_rng(0)
    inputs = []
    for i, dims in enumerate(((1, 16, 18, 18), (32, 16, 3, 3))):
        np.save(tmp_path / f"in{i}.npy", rng.normal(size=dims).astype(np.float32))
        inputs.append(f"--input=@{tmp_path / f'in{i}.npy'}")
    default = tmp_path / "default.vmfb"
    proc = run_tool("iree-compile", [str(path), *HOST.compile_flags, "-o", str(default)])
    assert proc.returncode == 0
    want, got = _run(default, inputs), _run(tmp_path / "op.vmfb", inputs)
    assert np.abs(want - got).max() <= 1e-4 * np.abs(want).max()


def test_unit_batch_conv_built_in_python_is_configured_batch_less(tmp_path: Path) -> None:
    """A 7-loop unit-batch Problem names the same op: matched batch-less, configured re-expanded."""
    built = Problem.conv2d_nhwc_hwcf(1, 8, 8, 16, 32, 3, 3)
    assert built.without_unit_batch().with_unit_batch() == built
    path = _problem_file(tmp_path, built)
    (seen,) = load_problems(path, HOST)
    assert seen.key == built.without_unit_batch().key
    info = enumerate_candidates(built, HOST).compilation_info(0)
    assert info == enumerate_candidates(seen, HOST).compilation_info(0)
    spec = write_spec(tuning_spec([(built, info)]), tmp_path / "spec.mlir")
    assert any(config_applied(info, got) for got in applied_configs(path, HOST, spec))


def test_contraction_with_two_m_loops_applies_and_compiles(tmp_path: Path) -> None:
    """ResNet's 1x1 stride-2 convolutions at batch 1: M = output height x width."""
    path = FIXTURES / "cpu_matmul_like_2m_f32.mlir"
    (problem,) = load_problems(path, HOST)
    assert len(problem.loops("m")) == 2
    _check_applies_and_compiles(path, tmp_path, "DoubleTilingExpert")
    table = enumerate_candidates(problem, HOST).table
    # IREE's default is distribution [16, 7, 14, 0], vectors [1, 2, 14, 0], reduction 16: its
    # vector tile 2 does not divide 7 (outside C2); the same tiles with vector 1 or 7 are in.
    default_tiles = (
        (table["knob_distribution_0"] == 16) & (table["knob_distribution_1"] == 7)
        & (table["knob_distribution_2"] == 14) & (table["knob_vector_common_parallel_2"] == 14)
        & (table["knob_vector_reduction_3"] == 16) & (table["knob_vector_common_parallel_0"] == 1)
    )
    assert set(table.loc[default_tiles, "knob_vector_common_parallel_1"]) == {1, 7}
    assert (table["tile_m"] == table["knob_distribution_1"] * table["knob_distribution_2"]).all()


def test_torch_dialect_export_is_lowered_once_and_tuned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatchtune.ir.lowering import lower_if_torch, scan_input

    monkeypatch.setenv("DISPATCHTUNE_CACHE", str(tmp_path / "cache"))
    source = FIXTURES / "torch_mm_f32.mlir"
    assert scan_input(source)[1] and not scan_input(FIXTURES / "cpu_conv_nchw_f32.mlir")[1]
    (problem,) = load_problems(source, HOST)
    assert problem.kind == "contraction" and problem.gemm_shape == (1, 64, 48, 32)
    lowered = lower_if_torch(source)
    stamp = lowered.stat().st_mtime_ns
    assert lower_if_torch(source) == lowered and lowered.stat().st_mtime_ns == stamp  # cached
    assert "!torch" not in lowered.read_text()
    assert len(enumerate_candidates(problem, HOST)) > 0


def test_bad_torch_export_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHTUNE_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "bad.mlir"
    bad.write_text((FIXTURES / "torch_mm_f32.mlir").read_text().replace("[32,48]", "[31,48]", 1))
    with pytest.raises(InputError) as info:
        load_problems(bad, HOST)
    assert "\n" not in str(info.value) and "torch" in str(info.value)


def test_attention_tunes_through_the_cli(tmp_path: Path) -> None:
    """`dispatchtune tune` on an attention: the dumped benchmark's op arrives as online_attention
    carrying the dump's `root_op` marker, which kept every spec from matching ("not applied") until
    the prepared benchmark dropped it; now every candidate applies, builds and verifies."""
    example = Path(__file__).resolve().parent.parent / "examples" / "attention_f16.mlir"
    tune_through_the_cli(example, 2, tmp_path / "out")
