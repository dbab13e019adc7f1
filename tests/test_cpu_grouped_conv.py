"""Grouped 2-D convolutions on llvm-cpu (NHWGC/GFHWC and NGCHW/GFCHW, batch 1 and 2): the search
enumerates them under DoubleTilingExpert (IREE 3.13's own pipeline for them), the spec applies
sampled candidates exactly, they compile, and their outputs equal the default build's."""

from __future__ import annotations

from pathlib import Path

import pytest
from cpu_checks import at_batch, first_and_last_apply_and_compute_the_same, tune_through_the_cli

from dispatchtune import load_problems
from dispatchtune.search import enumerate_candidates
from dispatchtune.targets import get_target

FIXTURES = Path(__file__).parent / "fixtures"
HOST = get_target("host")
NHWGC = FIXTURES / "cpu_grouped_conv_nhwgc_f32.mlir"
NGCHW = FIXTURES / "cpu_grouped_conv_ngchw_f32.mlir"
MULTIPLIER = FIXTURES / "cpu_depthwise_multiplier_f32.mlir"
NGCW = FIXTURES / "cpu_grouped_conv1d_ngcw_f32.mlir"


@pytest.mark.parametrize(("fixture", "batch"), [(NHWGC, 1), (NHWGC, 2), (NGCHW, 1), (NGCHW, 2)])
def test_grouped_conv_candidates_apply_compile_and_compute_the_same(
    fixture: Path, batch: int, tmp_path: Path
) -> None:
    """Heuristic first and last candidates: applied exactly, compiled, outputs = default build's."""
    path = at_batch(fixture, batch, tmp_path)
    problem = first_and_last_apply_and_compute_the_same(path, "DoubleTilingExpert", tmp_path)
    assert len(problem.loops("depth")) == 1 and problem.unit_batch_conv == (batch == 1)


@pytest.mark.parametrize("batch", [1, 2])
def test_1d_grouped_conv_candidates_apply_compile_and_compute_the_same(
    batch: int, tmp_path: Path
) -> None:
    """wav2vec2's positional convolution is a 1-D grouped conv (it was refused): the 2-D knobs
    less the output height; first and last candidates apply, compile and compute the default
    build's outputs."""
    path = at_batch(NGCW, batch, tmp_path)
    problem = first_and_last_apply_and_compute_the_same(path, "DoubleTilingExpert", tmp_path)
    assert len(problem.loops("output_image")) == 1 and problem.unit_batch_conv == (batch == 1)
    table = enumerate_candidates(problem, HOST).table
    assert (table["tile_oh"] == 1).all() and (table["tile_m"] % table["tile_ow"] == 0).all()


def test_a_grouped_conv_no_tile_fits_gets_partial_tiles(tmp_path: Path) -> None:
    """An output width of 994 = 2 x 7 x 71 has no divisor that fills native vectors and the
    whole width does not fit the registers: the space was empty. As for other convs, power-of-two
    distribution tiles with a partial last tile are admitted then; they compute the same."""
    path = tmp_path / "wide.mlir"
    path.write_text(NGCW.read_text().replace("x63x", "x1009x").replace("x48x", "x994x")
                    .replace("x48xf32", "x994xf32"))
    problem = first_and_last_apply_and_compute_the_same(path, "DoubleTilingExpert", tmp_path)
    assert problem.sizes("output_image") == (994,)
    table = enumerate_candidates(problem, HOST).table
    assert len(table) and (994 % table["tile_ow"] != 0).any()


@pytest.mark.parametrize("batch", [1, 2])
def test_depthwise_with_a_channel_multiplier_is_a_grouped_conv(batch: int, tmp_path: Path) -> None:
    """Conv2d(32, 64, 3, groups=32): one input channel per group, folded away by IREE, so the op
    has group and output-channel loops but no input-channel loop (it was refused). Configured as
    a grouped conv with a unit input-channel tile; first and last candidates apply, compile and
    compute the default build's outputs."""
    path = at_batch(MULTIPLIER, batch, tmp_path)
    problem = first_and_last_apply_and_compute_the_same(path, "DoubleTilingExpert", tmp_path)
    assert not problem.loops("input_channel") and problem.size("depth") == 32
    assert (enumerate_candidates(problem, HOST).table["tile_k"] == 1).all()


def test_grouped_conv_space_follows_the_constraints() -> None:
    """C1-C3, C5 on the contiguous output loop, C6, C7; the group loop is the GEMM view's batch."""
    facts = HOST.cpu_facts()
    for path, contiguous in ((NHWGC, "vec_n"), (NGCHW, "vec_m")):
        (problem,) = load_problems(path, HOST)
        table = enumerate_candidates(problem, HOST).table
        groups, m, n, k = problem.gemm_shape
        assert (groups % table["tile_b"] == 0).all() and (m % table["tile_m"] == 0).all()
        assert (n % table["tile_n"] == 0).all() and (k % table["tile_k"] == 0).all()
        assert (table["tile_n"] % table["vec_n"] == 0).all()
        assert (table["vec_m"] * table["vec_n"] * 4 <= facts.vector_registers
                * facts.native_vector_bytes).all()
        assert (table["workgroups"] >= facts.cores).all()
        assert table["tile_b"].nunique() > 1  # the group loop is tiled
        size = n if contiguous == "vec_n" else problem.sizes("output_image")[1]
        full = (table[contiguous] * 4) % facts.native_vector_bytes == 0
        assert (full | (table[contiguous] == size)).all()


def test_grouped_conv_tunes_through_the_cli(tmp_path: Path) -> None:
    """`dispatchtune tune --budget 2` on the batch-1 NHWGC fixture: candidates build, verify and
    run, and a spec is written."""
    tune_through_the_cli(NHWGC, 2, tmp_path / "out")


def test_grouped_conv_space_equals_a_brute_force() -> None:
    """Every knob combination satisfying the documented constraints, and nothing else."""
    import itertools

    (problem,) = load_problems(NGCHW, HOST)  # batch 1, NGCHW: C5 on the output width
    facts = HOST.cpu_facts()
    width, acc = facts.native_vector_bytes, 4
    groups, oc, ic = (problem.size(c) for c in ("depth", "output_channel", "input_channel"))
    oh, ow = problem.sizes("output_image")
    kw = problem.sizes("filter_loop")[1]

    def divisors(n: int) -> list[int]:
        return [d for d in range(1, n + 1) if n % d == 0]

    def c5(v: int) -> bool:
        if (ow * acc) % width == 0:
            return (v * acc) % width == 0 or v == ow
        return (v * acc) % width == 0 or v == ow or (
            v * acc >= min(16, width) and width % (v * acc) == 0)

    want = set()
    for dg, doh, dow, doc, ric in itertools.product(
        divisors(groups), divisors(oh), divisors(ow), divisors(oc), divisors(ic)
    ):
        if dg * doh * dow * doc * facts.cores > groups * oh * ow * oc:
            continue
        for vow, voc, rkw in itertools.product(divisors(dow), divisors(doc), sorted({1, kw})):
            if c5(vow) and vow * voc * acc <= facts.vector_registers * width:
                want.add((1, dg, doh, dow, doc, vow, voc, ric, rkw))
    table = enumerate_candidates(problem, HOST).table
    # Re-expanded loops [n, g, oc, oh, ow, ic, kh, kw]: knob columns by loop index.
    dist = [f"knob_distribution_{i}" for i in (0, 1, 3, 4, 2)]
    vec = [f"knob_vector_common_parallel_{i}" for i in (4, 2)]
    red = [f"knob_vector_reduction_{i}" for i in (5, 7)]
    got = {tuple(int(v) for v in row) for row in table[dist + vec + red].to_numpy()}
    assert got == want and len(table) == len(want)
